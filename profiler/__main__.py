"""`python -m profiler ...`: see profiler.cli."""
import sys

from profiler.cli import main

if __name__ == "__main__":
    sys.exit(main())
