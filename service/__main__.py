"""Embedded mode: the service on one machine, no Ray.

    python -m service --checkpoints checkpoints --port 8000
"""

import argparse
import logging
import uvicorn

from . import default_checkpoints
from .app import create_app
from .engine import Engine


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--checkpoints", default=default_checkpoints(),
                    help="directory of checkpoint directories (default: $TTCORE_CHECKPOINTS or the bundled ones)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--precision", choices=["auto", "fp32", "bf16"], default="auto",
                    help="auto: bf16 where the CPU (AVX512-BF16 / AMX) or GPU runs bf16 matmuls natively")
    ap.add_argument("--max-batch-samples", type=int, default=256)
    ap.add_argument("--max-requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--log-level", default="info")
    args = ap.parse_args()
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = Engine(args.checkpoints, device=args.device, precision=args.precision, threads=args.threads or None,
                    max_batch_samples=args.max_batch_samples, max_requests=args.max_requests)
    uvicorn.run(create_app(engine), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
