"""``python -m benchkit.profshim OUT -- chaingate ARGS...``: chaingate's CLI with a cProfile
switched by signals — SIGUSR1 starts it (a fresh profile), SIGUSR2 stops it and writes its
stats to OUT.  The profile's clock is the thread's CPU time (``time.thread_time``), so a
loaded machine inflates its times less than wall time would; the call counts do not depend on
load at all.  Only the main thread (trio's) is profiled."""

from __future__ import annotations

import cProfile
import signal
import sys
import time
from types import FrameType


def main() -> int:
    out, rest = sys.argv[1], sys.argv[3:]
    state: dict[str, cProfile.Profile] = {}

    def start(signum: int, frame: FrameType | None) -> None:
        state["profile"] = profile = cProfile.Profile(time.thread_time)
        profile.enable()

    def stop(signum: int, frame: FrameType | None) -> None:
        profile = state.pop("profile", None)
        if profile is not None:
            profile.disable()
            profile.dump_stats(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    from chaingate.cli import main as chaingate_main

    sys.argv = ["chaingate", *rest]
    return int(chaingate_main() or 0)


if __name__ == "__main__":
    sys.exit(main())
