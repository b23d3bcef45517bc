"""Study 'smooth': see hpcpipe/studies/smooth.py for the math and the checks.

Usage: python analysis/smooth.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.studies.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "smooth"]))
