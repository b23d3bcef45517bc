"""Study 'paper': see hpcpipe/studies/paper.py for the math and the checks.

Usage: python analysis/paper.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.studies.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "paper"]))
