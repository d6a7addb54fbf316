"""What a tool is for must keep working inside the sandbox: arithmetic, strings, loops, the standard library,
threads, files in its own folder, printing. Each program runs through `ToolUse.step`, as an episode runs it."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.envs.tool_use import ToolUse

pytestmark = pytest.mark.integration

PROGRAMS = {
    "arithmetic": ("print(3 * (4 + 5), 2 ** 100 % 97, 7 / 2, divmod(17, 5))", "27 16 3.5 (3, 2)"),
    "strings": ("s = 'Hello, sandbox'\nprint(s.upper()[::-1], s.split(', '), f'{len(s):04d}')",
                "XOBDNAS ,OLLEH ['Hello', 'sandbox'] 0014"),
    "loops": ("total = 0\nfor i in range(100000):\n    total += i * i\nprint(total)", "333328333350000"),
    "stdlib": ("import math, json, re, itertools, fractions, decimal, collections, statistics\n"
               "print(math.comb(10, 3), json.dumps({'a': [1, 2]}), re.findall(r'\\d+', 'a1b22'),\n"
               "      list(itertools.accumulate([1, 2, 3])), fractions.Fraction(3, 6), statistics.mean([1, 2, 3]),\n"
               "      collections.Counter('aab').most_common(1), decimal.Decimal('0.1') + decimal.Decimal('0.2'))",
               "120 {\"a\": [1, 2]} ['1', '22'] [1, 3, 6] 1/2 2 [('a', 2)] 0.3"),
    "files_in_folder": ("import os\nos.makedirs('d', exist_ok=True)\nopen('d/x.txt', 'w').write('42')\n"
                        "print(open('d/x.txt').read(), sorted(os.listdir('.')))", "42 ['d']"),
    "tmp_files": ("import tempfile\nwith tempfile.TemporaryFile() as f:\n    f.write(b'7'); f.seek(0); print(f.read())",
                  "b'7'"),
    "threads": ("import threading\nout = []\nts = [threading.Thread(target=out.append, args=(i,)) for i in range(8)]\n"
                "[t.start() for t in ts]; [t.join() for t in ts]\nprint(sorted(out))", "[0, 1, 2, 3, 4, 5, 6, 7]"),
    "exception_message": ("print(int('x'))", "Error: [\"ValueError: invalid literal for int() with base 10: 'x'\"]"),
    "unicode": ("print('π ≈', round(3.14159, 2), '✓')", "π ≈ 3.14 ✓"),
    "random_and_time": ("import random, time\nrandom.seed(1)\nt = time.monotonic()\nprint(random.randint(1, 6))",
                        "2"),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_program_works(name: str) -> None:
    code, expected = PROGRAMS[name]
    env = ToolUse()
    asyncio.run(env.reset(0))
    obs = asyncio.run(env.step(f"<python>{code}</python>")).observation
    assert obs.splitlines()[0] == expected, obs
