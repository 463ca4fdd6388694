"""Validation findings: every failed check is kept (never just the first) under a stable check name."""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_FINDINGS_PER_CHECK = 50


@dataclass(frozen=True)
class Finding:
    """One failed check: ``check`` is a stable dotted name (tests and CI match on it)."""

    check: str
    message: str
    path: str | None = None

    def __str__(self) -> str:
        where = f" [{self.path}]" if self.path else ""
        return f"{self.check}: {self.message}{where}"


@dataclass
class Findings:
    """The failures of one validation; repeats of one check beyond a cap are counted, not listed."""

    failures: list[Finding] = field(default_factory=list)
    suppressed: dict[str, int] = field(default_factory=dict)

    def fail(self, check: str, message: str, path: str | None = None) -> None:
        if sum(1 for f in self.failures if f.check == check) >= MAX_FINDINGS_PER_CHECK:
            self.suppressed[check] = self.suppressed.get(check, 0) + 1
            return
        self.failures.append(Finding(check, message, path))

    @property
    def ok(self) -> bool:
        return not self.failures

    def checks(self) -> set[str]:
        return {f.check for f in self.failures}
