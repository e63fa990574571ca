"""`python -m kvscope.cli`: the `kvscope` command without its console script (the vLLM
plugin's sidecar starts the bridge this way, in the engine's own environment)."""

import sys

from kvscope.cli.main import main

sys.exit(main())
