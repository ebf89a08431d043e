"""What the worker threads of one online run share with the loop that yields their rows."""

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any


@dataclass
class RunPool:
    """The items still to send, the workers sending them, and the rows they finished.

    Finished rows wait in ``buffer`` until the very moment they are yielded, so that a run left at any point (an
    interrupt may be raised between any two calls) still holds each of them in one place: a row taken out of a
    queue into a local would be lost with it."""

    items: Iterator[tuple[Any, Any]]
    buffer: list[tuple[Any, ...]] = field(default_factory=list)  # workers append; only the run's loop removes
    failures: list[BaseException] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)  # workers that are done
    wake: threading.Event = field(default_factory=threading.Event)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    _items_lock: threading.Lock = field(default_factory=threading.Lock)

    def next_item(self) -> tuple[Any, Any] | None:
        """The next item to send (None once they are all taken); workers take them one at a time."""
        with self._items_lock:
            return next(self.items, None)

    @property
    def done(self) -> bool:
        """Every worker has ended (so every row it finished is in ``buffer``)."""
        return len(self.ended) == len(self.threads)
