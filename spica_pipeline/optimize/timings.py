"""Where a sweep's time went: one type for the CLI summary line, report.md and Dagster metadata."""

from dataclasses import asdict, dataclass
from typing import Iterable, Protocol


class _Timed(Protocol):
    optimizer_seconds: float
    replay_seconds: float


@dataclass(frozen=True)
class Timings:
    """optimizer_seconds / replay_seconds: summed over the branch studies (replays overlap when
    several workers run, so their sum can exceed the wall time); wall_seconds: the studies' own wall
    time, first suggestion to last record (a Dagster run's studies add up their partitions')."""

    optimizer_seconds: float = 0.0
    replay_seconds: float = 0.0
    wall_seconds: float = 0.0

    @classmethod
    def of(cls, outcomes: Iterable[_Timed], wall_seconds: float) -> "Timings":
        outcomes = list(outcomes)
        return cls(optimizer_seconds=sum(o.optimizer_seconds for o in outcomes),
                   replay_seconds=sum(o.replay_seconds for o in outcomes),
                   wall_seconds=wall_seconds)

    def __add__(self, other: "Timings") -> "Timings":
        return Timings(self.optimizer_seconds + other.optimizer_seconds,
                       self.replay_seconds + other.replay_seconds, self.wall_seconds + other.wall_seconds)

    def to_dict(self) -> dict[str, float]:
        return asdict(self)
