"""`python -m kernelrl ...` is the `kernelrl` command."""

import sys

from kernelrl.cli import main

sys.exit(main())
