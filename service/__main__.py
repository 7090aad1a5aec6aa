"""Embedded mode: the service on one machine, no Ray.

    python -m service --checkpoints checkpoints --port 8000

Every flag is a field of ``service.config.EmbeddedArgs`` (the same names as the Ray Serve app args).
"""

import argparse
import ipaddress
import logging
import os

import uvicorn
from pydantic import ValidationError

from .app import create_app
from .config import EmbeddedArgs, add_arguments
from .http_guard import access_log_config, guarded_h11
from .security import ApiKeyError, SecurityConfig, load_api_keys
from .serving import build_serving

log = logging.getLogger("ttcore.service")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(ap, EmbeddedArgs)
    try:
        args = EmbeddedArgs(**vars(ap.parse_args()))
    except ValidationError as e:  # a flag out of its range: one line per rule, no traceback
        raise SystemExit("ttcore: " + "; ".join(f"--{'-'.join(map(str, err['loc'])).replace('_', '-')}: "
                                                f"{err['msg']}" for err in e.errors())) from None
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        keys = load_api_keys(args.api_key_file, os.environ.get("TTCORE_API_KEY"))
    except (ApiKeyError, OSError) as e:
        raise SystemExit(f"ttcore: {e}") from None  # one line naming the rule, not a traceback
    security = SecurityConfig.from_args(args, keys, loopback_only_default=_loopback(args.host))
    if keys:
        log.info("API keys: %d configured", len(keys))
    elif not _loopback(args.host):
        log.warning("no API key configured and bound to %s: anyone who reaches this port can use the service "
                    "(set --api-key-file or TTCORE_API_KEY)", args.host)
    uvicorn.run(create_app(build_serving(args), security), host=args.host, port=args.port, log_level=args.log_level,
                http=guarded_h11(args.read_timeout_s), log_config=access_log_config())


if __name__ == "__main__":
    main()
