import sys

from normkernels.bench.cli import main

sys.exit(main())
