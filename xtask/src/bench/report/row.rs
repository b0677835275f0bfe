//! A row of the table: its figures (which go to the JSON), the cells it shows, its
//! target and verdict; and the paired figure most rows are made of, the medians of a
//! workload with and without the agent and the ratios of its pairs.

use serde::Serialize;

use super::stats::{MedianInterval, median, median_interval, spread};
use crate::bench::{
    sample::{Mode, Sample},
    workload::Workload,
};

/// Pass, fail, or a figure without a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(super) enum Verdict {
    Pass,
    Fail,
    Info,
}

impl Verdict {
    fn of(pass: bool) -> Self {
        if pass { Self::Pass } else { Self::Fail }
    }

    fn label(self) -> &'static str {
        match self {
            Self::Pass => "pass",
            Self::Fail => "FAIL",
            Self::Info => "—",
        }
    }
}

/// One line of the table; the numbers go to the JSON too.
#[derive(Debug, Clone, Serialize)]
pub(super) struct Row {
    pub metric: String,
    pub baseline: Option<f64>,
    pub agent: Option<f64>,
    /// The figure judged against the target (a ratio, ns, MiB, %...).
    pub value: Option<f64>,
    /// For a ratio: the smallest and largest of the pair ratios `value` is the median of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_min: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ratio_max: Option<f64>,
    /// For a ratio: where the median of the pair ratios lies, with at least 95 %
    /// confidence (see [`median_interval`]); none with fewer than six pairs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub median_interval: Option<MedianInterval>,
    /// For a judged ratio with an interval: whether the interval lies wholly on one side
    /// of the target, so that the pairs settle the verdict; `false` shows as
    /// "(unresolved)" beside it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resolved: Option<bool>,
    /// How the table shows the row: baseline, with agent, value, spread.
    #[serde(skip)]
    pub(super) cells: [String; 4],
    pub target: String,
    pub verdict: Verdict,
}

impl Row {
    /// A row without a target; `cells` are baseline, with agent, value.
    pub(super) fn new(
        metric: impl Into<String>,
        [baseline, agent, value]: [Option<f64>; 3],
        [b, a, v]: [String; 3],
    ) -> Self {
        Self {
            metric: metric.into(),
            baseline,
            agent,
            value,
            ratio_min: None,
            ratio_max: None,
            median_interval: None,
            resolved: None,
            cells: [b, a, v, "—".to_owned()],
            target: "—".to_owned(),
            verdict: Verdict::Info,
        }
    }

    /// Judged against `target`: pass or fail.
    pub(super) fn target(mut self, target: impl Into<String>, pass: bool) -> Self {
        self.target = target.into();
        self.verdict = Verdict::of(pass);
        self
    }

    /// Shows the spread of the pair ratios behind a ratio.
    fn spread(mut self, ratios: &[f64]) -> Self {
        self.ratio_min = ratios.iter().copied().reduce(f64::min);
        self.ratio_max = ratios.iter().copied().reduce(f64::max);
        self.median_interval = median_interval(ratios);
        self.cells[3] = match &self.median_interval {
            Some(i) => format!("{}; {:.3}–{:.3}", spread(ratios), i.low, i.high),
            None => spread(ratios),
        };
        self
    }

    /// The verdict's cell: pass or FAIL, "(unresolved)" when the median's interval
    /// straddles the target.
    pub(super) fn verdict_cell(&self) -> String {
        match self.resolved {
            Some(false) => format!("{} (unresolved)", self.verdict.label()),
            _ => self.verdict.label().to_owned(),
        }
    }
}

/// The samples of one workload in one mode.
pub(super) fn of(
    samples: &[Sample],
    workload: Workload,
    mode: Mode,
) -> impl Iterator<Item = &Sample> {
    samples
        .iter()
        .filter(move |s| s.workload == workload && s.mode == mode)
}

/// A figure of one workload with and without the agent.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Paired {
    /// Medians.
    pub(super) baseline: Option<f64>,
    pub(super) agent: Option<f64>,
    /// Agent ÷ baseline of each pair (the same run, measured back to back).
    ratios: Vec<f64>,
}

impl Paired {
    pub(super) fn of(
        samples: &[Sample],
        workload: Workload,
        figure: impl Fn(&Sample) -> Option<f64>,
    ) -> Self {
        let mut base: Vec<f64> = of(samples, workload, Mode::Baseline)
            .filter_map(&figure)
            .collect();
        let mut with: Vec<f64> = of(samples, workload, Mode::Agent)
            .filter_map(&figure)
            .collect();
        let ratios: Vec<f64> = of(samples, workload, Mode::Agent)
            .filter_map(|a| {
                let b = of(samples, workload, Mode::Baseline).find(|b| b.run == a.run)?;
                let (a, b) = (figure(a)?, figure(b)?);
                (b > 0.0).then(|| a / b)
            })
            .collect();
        Self {
            baseline: median(&mut base),
            agent: median(&mut with),
            ratios,
        }
    }

    /// The median of the pair ratios.
    fn ratio(&self) -> Option<f64> {
        median(&mut self.ratios.clone())
    }

    /// A row of the two medians (shown by `show`), the median ratio and its spread.
    pub(super) fn row(&self, metric: impl Into<String>, show: impl Fn(f64) -> String) -> Row {
        let ratio = self.ratio();
        Row::new(
            metric,
            [self.baseline, self.agent, ratio],
            [
                fmt(self.baseline, &show),
                fmt(self.agent, &show),
                fmt(ratio, |r| format!("{r:.3}")),
            ],
        )
        .spread(&self.ratios)
    }

    /// The row judged: the median ratio at least `target`.
    pub(super) fn row_at_least(
        &self,
        metric: impl Into<String>,
        show: impl Fn(f64) -> String,
        target: f64,
    ) -> Row {
        let pass = self.ratio().is_some_and(|r| r >= target);
        let mut row = self
            .row(metric, show)
            .target(format!("≥ {target:.2}"), pass);
        row.resolved = row
            .median_interval
            .map(|i| i.low >= target || i.high < target);
        row
    }
}

pub(super) fn fmt(value: Option<f64>, f: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "n/a".to_owned(), f)
}

pub(super) fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(run: u32, mode: Mode, value: f64) -> Sample {
        Sample {
            value,
            ..Sample::new(run, Workload::IperfOverlay, mode)
        }
    }

    #[test]
    fn ratios_pair_runs() {
        let samples = [
            sample(0, Mode::Baseline, 10.0),
            sample(0, Mode::Agent, 9.0),
            sample(1, Mode::Agent, 20.0),
            sample(1, Mode::Baseline, 20.0),
            sample(2, Mode::Baseline, 10.0),
            sample(2, Mode::Agent, 10.0),
        ];
        let paired = Paired::of(&samples, Workload::IperfOverlay, |s| Some(s.value));
        assert_eq!(
            (paired.baseline, paired.agent, paired.ratio()),
            (Some(10.0), Some(10.0), Some(1.0))
        );
        assert_eq!(paired.ratios, [0.9, 1.0, 1.0]);
        let row = paired.row("overlay", |v| format!("{v}"));
        assert_eq!((row.ratio_min, row.ratio_max), (Some(0.9), Some(1.0)));
        assert_eq!(row.cells[3], "0.900–1.000");
    }

    #[test]
    fn unresolved_when_the_interval_straddles_the_target() {
        let pairs = |ratios: &[f64]| {
            let samples: Vec<Sample> = ratios
                .iter()
                .enumerate()
                .flat_map(|(run, &r)| {
                    let run = run as u32;
                    [
                        sample(run, Mode::Baseline, 100.0),
                        sample(run, Mode::Agent, 100.0 * r),
                    ]
                })
                .collect();
            Paired::of(&samples, Workload::IperfOverlay, |s| Some(s.value)).row_at_least(
                "x",
                |v| format!("{v}"),
                0.99,
            )
        };
        let row = pairs(&[0.97, 0.98, 0.985, 0.995, 1.0, 1.01, 1.02]);
        assert_eq!(row.verdict, Verdict::Pass);
        assert_eq!(row.resolved, Some(false));
        assert_eq!(row.verdict_cell(), "pass (unresolved)");
        assert_eq!(row.cells[3], "0.970–1.020; 0.970–1.020");
        let row = pairs(&[0.995, 0.996, 0.997, 0.998, 0.999, 1.0, 1.001]);
        assert_eq!(
            (row.verdict_cell(), row.resolved),
            ("pass".to_owned(), Some(true))
        );
        let row = pairs(&[0.90, 0.91, 0.92, 0.93, 0.94, 0.95, 0.96]);
        assert_eq!(row.verdict_cell(), "FAIL");
        // Too few pairs for an interval: judged on the median alone.
        let row = pairs(&[0.90, 1.0]);
        assert_eq!(
            (row.resolved, row.verdict_cell()),
            (None, "FAIL".to_owned())
        );
    }
}
