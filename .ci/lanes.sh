#!/usr/bin/env bash
# The newest and the oldest lane, beside the pinned set .ci/run tests: each is a
# fresh environment (.lanes/NAME) installed from .ci/NAME.txt, in which the unit
# tests, the kernel tests (the example notebooks among them) and the docs' code blocks run. newest.txt
# names the newest releases, unpinned; oldest.txt the lowest versions
# pyproject.toml allows. The two lanes run side by side (their tests mostly wait
# on kernels and ranks; each pytest session tells its own processes apart), each
# into its log, shown when both are done with its key versions and what it
# cost. A lane that fails fails the script.
set -uo pipefail
cd "$(dirname "$0")/.."

KEY='^(torch|cloudpickle|psutil|ipython|ipykernel|ipywidgets|jupyter[_-]client|tqdm|pandas|numpy|accelerate|transformers|keras|lightning|ray)=='

lane() {
    local name=$1 started=$SECONDS
    rm -rf ".lanes/$name" &&
        python3 -m venv ".lanes/$name" &&
        ".lanes/$name/bin/pip" install -q --no-compile -r ".ci/$name.txt" -e . || return 1
    local installed=$((SECONDS - started))
    echo "lane $name: $(".lanes/$name/bin/pip" freeze | grep -iE "$KEY" | tr '\n' ' ')"
    ".lanes/$name/bin/python" -m pytest -q -p no:cacheprovider tests/unit tests/kernel tests/docs
    local status=$?
    echo "lane $name: installed in ${installed}s, tested in $((SECONDS - started - installed))s"
    return $status
}

mkdir -p .lanes
lane newest >.lanes/newest.log 2>&1 &
newest=$!
lane oldest >.lanes/oldest.log 2>&1 &
oldest=$!
wait $newest
newest_status=$?
wait $oldest
oldest_status=$?
# (This machine's pip configuration names index folders that are not there: one
# warning per package, left out.)
grep -hv "^WARNING: Location '.*' is ignored" .lanes/newest.log .lanes/oldest.log
echo "lanes: newest exit $newest_status, oldest exit $oldest_status"
[ $newest_status -eq 0 ] && [ $oldest_status -eq 0 ]
