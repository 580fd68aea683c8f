"""``python -m das_trl.bench.live`` (the same as ``das-trl bench live``)."""

import os

from das_trl.bench.live.run import main

if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
