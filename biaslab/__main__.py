import sys

from biaslab.console import main

sys.exit(main())
