"""Reference outputs of differential (EvalPlus) suites, computed once per problem per process.

A problem's reference solution used to run again in every sample's sandbox; on MBPP+ that was
about half of a sample's time for the heaviest problems. Now the first sample of a suite
computes the outputs and times in its sandbox (before its candidate runs) and the driver sends
them back on a pipe it closes before candidate code runs; later samples of the same suite carry
them as ``expected``. EvalPlus likewise computes a problem's expected outputs and reference
times once. The host only stores the driver's opaque text (it never unpickles it).

Keyed by the suite's spec text and the sandbox's interpreter. Samples of a suite wait while its
first sample computes (one lock per suite), so a batch of samples of one problem does not run
its reference once per worker.

Outputs that cannot be kept (the driver's pickle passed its cap or failed, or they no longer fit
``CACHE_BYTES``) are computed by every sample, which then does not pickle or send them: each
sample of such a suite used to pickle up to the cap again for nothing (MBPP+'s Mbpp/255, whose
plus outputs pass the cap: ~40 ms of a sample's ~3.5 CPU seconds; once the store is full, every
unstored problem's whole outputs, up to 12 MiB pickled, a sample).
"""
from __future__ import annotations

import threading

CACHE_BYTES = 512 << 20  # the most reference text one process keeps


class References:
    def __init__(self, limit: int = CACHE_BYTES):
        self.limit, self.size = limit, 0
        self.blobs: dict[tuple, str] = {}
        self.pending: dict[tuple, threading.Event] = {}  # first samples computing right now
        self.unshared: set[tuple] = set()  # a run computed it and sent nothing: nobody waits
        self.unsendable: set[tuple] = set()  # too large or unpicklable: no run sends it again
        self.guard = threading.Lock()

    def claim(self, key: tuple, wait: bool = True) -> tuple[str | None, bool]:
        """(the stored text, False), or (None, whether this caller is the suite's first sample,
        which must ``settle`` it): the caller's sandbox then computes the reference. A caller
        that is already first for another suite passes ``wait=False`` (no waiting cycles)."""
        while True:
            with self.guard:
                if key in self.blobs:
                    return self.blobs[key], False
                if key in self.unshared or key in self.unsendable:
                    return None, False
                event = self.pending.get(key)
                if event is None:
                    self.pending[key] = threading.Event()
                    return None, True
            if not wait:
                return None, False
            event.wait()

    def sendable(self, key: tuple) -> bool:
        """False once a run found the outputs too large to send or to keep (``settle``): later
        runs compute them without pickling them."""
        with self.guard:
            return key not in self.unsendable

    def stored(self, key: tuple) -> str | None:
        """The stored text, without claiming or waiting (a sample that shares nothing)."""
        with self.guard:
            return self.blobs.get(key)

    def settle(self, key: tuple, blob: str | None) -> None:
        """Store what a run sent back (None: nothing, later samples compute it themselves and
        send it again; "": the driver could not send it, too large or unpicklable, so later
        samples compute it without sending it, as they do where it does not fit ``limit``)."""
        with self.guard:
            if blob and key not in self.blobs and self.size + len(blob) <= self.limit:
                self.blobs[key] = blob
                self.size += len(blob)
            elif key not in self.blobs:
                # the store never shrinks, and the same outputs come back as large
                (self.unsendable if blob is not None else self.unshared).add(key)
            event = self.pending.pop(key, None)
        if event:
            event.set()


REFERENCES = References()
