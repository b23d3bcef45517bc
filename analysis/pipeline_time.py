"""Study 'pipeline-time': see hpcpipe/studies/pipeline_time.py for the math and the checks.

Usage: python analysis/pipeline_time.py RESULTS_DIR [-o REPORT_DIR]
"""

import sys

from hpcpipe.studies.report import main

if __name__ == "__main__":
    sys.exit(main([*sys.argv[1:], "--study", "pipeline-time"]))
