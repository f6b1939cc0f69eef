"""What the test suite spends, counted rather than timed: engine starts, command-line runs, cells, tokens, reports.

Timings of the suite on a busy machine say little; these counts do not depend on the load. Runs pytest with the
given arguments and a plugin that counts, per test file:

- ``cli``: ``python -m specbench`` (or ``-m specbench.<module>``) subprocesses the test process started (each pays
  an interpreter, Hydra and, for a sweep, a vLLM import in its fork server: about 10-15 s on 2 cores);
- ``engines``: vLLM engines initialised ("Initializing a V1 LLM engine" in a sweep's ``specbench.log`` or in the
  test's captured output); ``failed``: engine starts that failed ("engine failed to start");
- ``cells``: cell result files written, and ``tokens``: their ``output_tokens`` (one timed repetition's);
- ``reports``: HTML reports rendered, in the test process (``specbench.report.render_report``) or by a command
  (its "report: " line).

Prints the table and the totals; asserts nothing.

    .venv/bin/python tests/benchmarks/suite_costs.py -m engine tests/test_e2e.py
    .venv/bin/python tests/benchmarks/suite_costs.py -m engine             # the engine pass
"""

from __future__ import annotations

import subprocess
import sys
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

ENGINE_LINE = "Initializing a V1 LLM engine"
FAILED_LINE = "engine failed to start"
COLUMNS = ("cli", "engines", "failed", "cells", "tokens", "reports")


class SuiteCosts:
    """The pytest plugin: attributes what each test phase started or wrote to the test's file."""

    def __init__(self) -> None:
        self.costs: dict[str, Counter[str]] = defaultdict(Counter)
        self.current = "(collection)"
        self.seen_logs: dict[tuple[Path, str], int] = {}
        self.seen_files: dict[Path, float] = {}
        self.basetemp: Path | None = None

    def pytest_configure(self, config: pytest.Config) -> None:
        from specbench.report import page

        original, communicate, render = subprocess.Popen.__init__, subprocess.Popen.communicate, page.render_report
        plugin = self

        def counting(popen: subprocess.Popen, args: Any, *rest: Any, **kwargs: Any) -> None:
            argv = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
            popen._specbench = any(a == "-m" and b.split(".")[0] == "specbench"  # type: ignore[attr-defined]
                                   for a, b in zip(argv, argv[1:]))
            plugin.costs[plugin.current]["cli"] += popen._specbench  # type: ignore[attr-defined]
            original(popen, args, *rest, **kwargs)

        def reading(popen: subprocess.Popen, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            out, err = communicate(popen, *args, **kwargs)
            if getattr(popen, "_specbench", False):
                text = "".join(s if isinstance(s, str) else (s or b"").decode(errors="replace") for s in (out, err))
                plugin.costs[plugin.current]["reports"] += sum(
                    line.startswith("report: ") for line in text.splitlines())
            return out, err

        def rendering(*args: Any, **kwargs: Any) -> Any:
            plugin.costs[plugin.current]["reports"] += 1
            return render(*args, **kwargs)

        subprocess.Popen.__init__ = counting  # type: ignore[method-assign]
        subprocess.Popen.communicate = reading  # type: ignore[method-assign]
        page.render_report = rendering  # write_report renders through it

    def pytest_runtest_logstart(self, nodeid: str, location: tuple[str, int | None, str]) -> None:
        self.current = location[0]

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        captured = "".join(text for _, text in report.sections)
        self.costs[self.current]["engines"] += captured.count(ENGINE_LINE)
        self.costs[self.current]["failed"] += captured.count(FAILED_LINE)
        self._scan(report)

    def _scan(self, report: pytest.TestReport) -> None:
        """What appeared under the session's temporary directory since the last phase."""
        import pyarrow.parquet as pq

        if self.basetemp is None:
            return
        cost = self.costs[self.current]
        for log in self.basetemp.rglob("specbench.log"):
            text = log.read_text(errors="replace")
            for column, line in (("engines", ENGINE_LINE), ("failed", FAILED_LINE)):
                count = text.count(line)
                cost[column] += count - self.seen_logs.get((log, column), 0)
                self.seen_logs[(log, column)] = count
        for path in self.basetemp.rglob("cells/*.parquet"):
            if path.name.endswith(".tokens.parquet"):
                continue
            mtime = path.stat().st_mtime
            if self.seen_files.get(path) == mtime:
                continue
            self.seen_files[path] = mtime
            cost["cells"] += 1
            tokens = pq.read_table(path).to_pydict().get("output_tokens") or []
            cost["tokens"] += int(sum(v or 0 for v in tokens))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        factory = getattr(session.config, "_tmp_path_factory", None)
        self.basetemp = factory.getbasetemp() if factory is not None else None

    def table(self) -> str:
        """One line per test file, then the totals."""
        lines = [f"{'file':<40}" + "".join(f"{c:>9}" for c in COLUMNS)]
        total: Counter[str] = Counter()
        for name in sorted(self.costs):
            cost = self.costs[name]
            if not any(cost.values()):
                continue
            total.update(cost)
            lines.append(f"{name:<40}" + "".join(f"{cost[c]:>9}" for c in COLUMNS))
        lines.append(f"{'total':<40}" + "".join(f"{total[c]:>9}" for c in COLUMNS))
        return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run pytest on ``argv`` with the counting plugin; print the table."""
    plugin = SuiteCosts()
    code = pytest.main(["-p", "no:cacheprovider", *argv], plugins=[plugin])
    print(plugin.table())
    return int(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
