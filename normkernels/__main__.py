import sys

from normkernels.cli import main

sys.exit(main())
