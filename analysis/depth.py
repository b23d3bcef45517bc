"""Study 'depth': see hpcpipe/analysis/depth.py for the math and the checks.

Usage: python analysis/depth.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.analysis.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "depth"]))
