"""``python -m dlmpipe.campaign [config.yaml ...]``: the campaign checked and expanded, printed
(every problem at once, exit status 2, when it is invalid)."""
from __future__ import annotations

import json
import sys

from ..config_schema import ConfigError


def main(argv: list[str] | None = None) -> int:
    from . import load_campaign

    paths = (argv if argv is not None else sys.argv[1:]) or ["config.yaml"]
    try:
        c = load_campaign(paths)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return 2
    print(f"backbones: {', '.join(c.backbones)}\ntasks: {', '.join(c.tasks)}\n"
          f"methods ({len(c.methods)}), reference {c.config['reference_method']}:")
    scopes = c.scopes()
    for name, m in c.methods.items():
        shown = {k: m[k] for k in ("sampler", "cache", "gen_length", "block_size") if k in m}
        print(f"  {name:24s} {json.dumps(shown)}")
        if (scope := scopes.get(c.origin[name])):
            print(f"    runs on backbones {', '.join(scope['backbones'])}; "
                  f"tasks {', '.join(scope['tasks'])}")
        for where, diff in c.differences(name).items():
            print(f"    on {where}: {diff}")
    print(f"generate jobs: {len(c.decoding_jobs())}")
    return 0
