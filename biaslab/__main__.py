import sys

from biaslab.cli import main

sys.exit(main())
