"""How states look: the colours the kernel display and the panel give rank and run states.

Contract: ``STATE_COLORS`` maps the ended ``RankState`` members to a CSS
colour, ``RUN_COLORS`` does the same for every ended ``RunStatus``; a state
without an entry (starting, running) is drawn in the default colour. Keys
are ``str`` enum members, so a state's plain name finds its colour too.
"""

from __future__ import annotations

from nbddp.launcher.events import RankState, RunStatus

_GREEN, _RED, _ORANGE = "#2ca02c", "#d62728", "#ff7f0e"

STATE_COLORS: dict[str, str] = {
    RankState.DONE: _GREEN,
    RankState.FAILED: _RED,
    RankState.STOPPED: _ORANGE,
}
RUN_COLORS: dict[str, str] = {
    **STATE_COLORS,
    RunStatus.TIMEOUT: _RED,
    RunStatus.INTERRUPTED: _ORANGE,
}
