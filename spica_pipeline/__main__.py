import sys

from spica_pipeline.cli import main

if __name__ == "__main__":
    sys.exit(main())
