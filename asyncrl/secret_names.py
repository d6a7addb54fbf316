"""Which names hold secrets: parameter keys kept out of MLflow, environment variables kept from environment workers.

Substrings: secret, password, passwd, key_id, access_key, api_key, credential, private_key. Whole `_`/`-`
segments of the last dotted component: token, auth, bearer (so `hf_token`, `access_token` and
`ASYNCRL_ROLE_TOKEN` are secret, `max_new_tokens` is not).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

_SECRET_SUBSTRINGS = ("secret", "password", "passwd", "key_id", "access_key", "api_key", "credential", "private_key")
_SECRET_SEGMENTS = {"token", "auth", "bearer"}


def is_secret_key(key: str) -> bool:
    """True when a (dotted) parameter or variable name looks like it holds a secret (module docstring)."""
    low = key.lower()
    if any(s in low for s in _SECRET_SUBSTRINGS):
        return True
    last = low.rsplit(".", 1)[-1]
    return any(seg in _SECRET_SEGMENTS for seg in re.split(r"[_\-]", last))


def without_secrets(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` less every variable whose name holds a secret (S3 keys, the role token, MLflow credentials)."""
    return {k: v for k, v in environ.items() if not is_secret_key(k)}
