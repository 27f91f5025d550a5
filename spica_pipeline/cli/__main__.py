"""`python -m spica_pipeline.cli`: the `spica` command."""

import sys

from spica_pipeline.cli import main

sys.exit(main())
