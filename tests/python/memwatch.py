"""The peak of a process's anonymous resident memory (RssAnon: what the kernel cannot drop;
a mapped file's pages are RssFile) while a block runs, sampled every 2 ms by a thread: the
compile-memory tests run their compile in a child process inside it."""

import threading
import time


def anon_bytes() -> int:
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("RssAnon"):
                return int(line.split()[1]) * 1024
    return 0


class AnonPeak:
    """with AnonPeak() as m: ...  then m.base (bytes before) and m.peak (the highest sample)."""

    def __enter__(self):
        self.base = self.peak = anon_bytes()
        self._done = False
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._done:
            self.peak = max(self.peak, anon_bytes())
            time.sleep(0.002)

    def __exit__(self, *exc):
        self._done = True
        self._thread.join()
        self.peak = max(self.peak, anon_bytes())
        return False
