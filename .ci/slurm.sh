#!/usr/bin/env bash
# Debian's Slurm and munge for the Slurm engine's tests (tests/slurm): the tests
# start their own two-node cluster on this machine from tests/slurm/cluster.sh.
set -euo pipefail
command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v srun >/dev/null \
  && command -v munged >/dev/null && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
packages="slurmctld slurmd slurm-client munge"
$sudo apt-get install -y -q --no-install-recommends $packages >/dev/null \
  || { $sudo apt-get update -q >/dev/null \
       && $sudo apt-get install -y -q --no-install-recommends $packages >/dev/null; }
