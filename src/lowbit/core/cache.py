"""Where lowbit keeps what it can rebuild: one cache directory for every kind of file.

`cache_dir("nvrtc")` is `$LOWBIT_CACHE_DIR/nvrtc` when that variable is set, else
`<user cache dir>/lowbit/nvrtc` (platformdirs: `$XDG_CACHE_HOME/lowbit` or `~/.cache/lowbit` on
Linux). The NVRTC cubins (`nvrtc`), the host emulation's libraries (`emu`), the trained
performance model (`perfmodel`) and the default tuning records (`records.sqlite`) live there.
The directory is created by whoever first writes into it.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir(*parts: str) -> Path:
    """The cache directory, or the entry `parts` under it (module doc)."""
    env = os.environ.get("LOWBIT_CACHE_DIR")
    if env:
        base = Path(env)
    else:
        import platformdirs

        base = Path(platformdirs.user_cache_dir("lowbit"))
    return base.joinpath(*parts)
