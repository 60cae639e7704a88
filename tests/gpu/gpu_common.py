"""What tests/gpu's stage scripts share (parity.py, throughput.py)."""
import json
import sys


def finish(json_path, result, rc):
    """Writes result to json_path (if given) and returns rc, the exit status."""
    if json_path:
        with open(json_path, "w") as f:
            json.dump(result, f, indent=1)
    return rc


def run_main(main):
    sys.exit(main(sys.argv[1:]))
