"""``python -m gpu_offload.cli``: the ``gpu-offload`` command without its console script."""

import sys

from . import main

sys.exit(main())
