"""How states look: the colours and words the kernel display and the panel give states.

``STATE_COLORS`` maps each ``RankState`` drawn in a colour of its own to a CSS colour,
``RUN_COLORS`` each ended ``RunStatus`` (and the rank states); keys are ``str`` enums, so plain
names work; a state without an entry is drawn in the default colour. ``state_words(state,
detail)`` is a state as a header says it. The failed rank is red, ranks stopped because of it grey.
"""

from __future__ import annotations

from nbddp.launcher.events import RankState, RunStatus

_GREEN, _RED, _DARK_RED = "#2ca02c", "#d62728", "#a50f15"
_ORANGE, _BROWN, _GREY = "#e6550d", "#8c510a", "#7f7f7f"
_BLUE = "#1f77b4"

STATE_COLORS: dict[str, str] = {
    RankState.WAITING: _BLUE,
    RankState.DONE: _GREEN,
    RankState.FAILED: _RED,
    RankState.EXITED: _DARK_RED,
    RankState.STOPPED: _ORANGE,
    RankState.INTERRUPTED: _ORANGE,
    RankState.TIMED_OUT: _BROWN,
    RankState.CANCELLED: _GREY,
}
RUN_COLORS: dict[str, str] = {
    **STATE_COLORS,
    RunStatus.TIMEOUT: _BROWN,  # (RunStatus.INTERRUPTED is RankState.INTERRUPTED's word)
}

_WORDS: dict[str, str] = {
    RankState.FAILED: "failed: {}",
    RankState.EXITED: "exited with {}",
    RankState.CANCELLED: "stopped: {}",
}


def state_words(state: str, detail: str = "") -> str:
    """``state`` as a header says it: ``failed: ValueError``, ``exited with code 3``,
    ``killed by SIGKILL``, ``stopped: rank 1 failed``; the state's name otherwise."""
    form = _WORDS.get(state)
    if form is None or not detail:
        return str(state)
    if state == RankState.EXITED and detail.startswith(("SIG", "signal")):
        return f"killed by {detail}"
    return form.format(detail)
