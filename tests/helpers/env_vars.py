"""Environment variables put back as they were: tests that let a run, a trainer or a server write into os.environ
(S3 keys, the role token, torch.distributed's MASTER_PORT & co.) wrap that in `restored_env(names)`."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def restored_env(names: Iterable[str]) -> Iterator[None]:
    """On exit, each variable in `names` has its value from entry again, or is unset if it was unset then."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
