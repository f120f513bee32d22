"""The GPU package format's constants exist once: scripts/gen_package_format.py's table, from
which the C++, Python and TypeScript files are generated; they must be what it writes."""

import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")


def test_generated_constants_are_up_to_date():
    r = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gen_package_format.py"), "--check"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_runtimes_use_them():
    from chroma.runtime import package, package_format

    assert package.MAGIC == package_format.MAGIC == b"CHROMAWB"
    assert package.HEADER_SIZE == package_format.HEADER_SIZE and package.ALIGN == package_format.ALIGNMENT
    assert package.DEFAULT_LIMITS is package_format.DEFAULT_LIMITS
    ts = open(os.path.join(ROOT, "web", "src", "format.ts"), encoding="utf-8").read()
    assert "from './package_format.js'" in ts and "export const MAGIC" not in ts
    cpp = open(os.path.join(ROOT, "src", "targets", "gpu", "package.cpp"), encoding="utf-8").read()
    assert '#include "chroma/package_format.h"' in cpp and '"CHROMAWB"' not in cpp
