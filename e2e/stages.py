"""The stage record of `make e2e`: each stage's time and result, the table it prints, the JSON it writes."""

from __future__ import annotations

import json
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from e2e.kube import StageError


@dataclass
class Stage:
    name: str
    result: str = "not run"  # pass | fail | not run | skipped
    seconds: float = 0.0
    detail: str = ""


@dataclass
class Record:
    """Every stage of this run, in order, with a say() for progress lines."""

    out_dir: Path
    say: Callable[[str], None] = print
    stages: list[Stage] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)

    @contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[Stage]:
        """Time a stage; StageError marks it failed (and stops the run), anything else too, with its type."""
        st = Stage(name, detail=detail)
        self.stages.append(st)
        self.say(f"[e2e] {name} …")
        t0 = time.monotonic()
        try:
            yield st
        except StageError as e:
            st.result, st.detail = "fail", str(e)
            raise
        except KeyboardInterrupt:
            st.result, st.detail = "fail", "interrupted"
            raise
        except Exception as e:  # a defect of the e2e itself: keep its traceback in the log, one line here
            st.result = "fail"
            st.detail = f"{type(e).__name__}: {e}"
            with open(self.out_dir / "e2e.log", "a", encoding="utf-8") as f:
                f.write(traceback.format_exc())
            raise StageError(f"{name}: {st.detail}") from e
        finally:
            st.seconds = round(time.monotonic() - t0, 1)
        st.result = "pass"
        self.say(f"[e2e] {name}: pass ({st.seconds:.0f} s){' - ' + st.detail if st.detail else ''}")

    def skip(self, name: str, why: str) -> None:
        self.stages.append(Stage(name, "skipped", 0.0, why))
        self.say(f"[e2e] {name}: skipped - {why}")

    @property
    def ok(self) -> bool:
        return bool(self.stages) and all(s.result in {"pass", "skipped"} for s in self.stages)

    def table(self) -> str:
        w = max([len(s.name) for s in self.stages] + [5])
        rows = [f"{'stage':<{w}}  {'time':>7}  result", f"{'-' * w}  {'-' * 7}  ------"]
        for s in self.stages:
            first = s.detail.splitlines()[0][:100] if s.detail else ""
            rows.append(f"{s.name:<{w}}  {s.seconds:>6.0f}s  {s.result}{'  ' + first if first else ''}")
        rows.append(f"{'total':<{w}}  {time.monotonic() - self.started:>6.0f}s  {'pass' if self.ok else 'fail'}")
        return "\n".join(rows)

    def write(self) -> Path:
        path = self.out_dir / "summary.json"
        data = {"result": "pass" if self.ok else "fail", "seconds": round(time.monotonic() - self.started, 1),
                "stages": [asdict(s) for s in self.stages], **self.facts}
        path.write_text(json.dumps(data, indent=2) + "\n")
        return path
