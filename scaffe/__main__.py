"""`python -m scaffe ...`: the same command line as the `scaffe` console script."""
import sys

from scaffe.cli import main

sys.exit(main())
