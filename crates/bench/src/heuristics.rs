//! The seeds' sweep heuristics: stop a depth sweep once latency is out of control, and find
//! the deepest queue that still meets a latency target.

use crate::report::Row;
use crate::workload::{StepStats, Workload};

/// When to stop stepping to deeper queues: the latency distribution is too wide (coefficient
/// of variation) or the mean completion latency too high.
///
/// The seeds apply the width test at any latency; their Ceph runs sit in milliseconds. At tens of
/// microseconds one scheduler hiccup alone makes stdev/mean exceed 0.5 at queue depth 1, so the
/// width test only applies once the mean is at least `cv_min_mean_ms`.
#[derive(Clone, Copy, Debug)]
pub struct EarlyExit {
    pub max_cv: f64,
    pub max_mean_ms: f64,
    pub cv_min_mean_ms: f64,
}

impl EarlyExit {
    /// Why the sweep should stop after this step, if it should.
    pub fn reason(&self, s: &StepStats) -> Option<String> {
        let cv = s.lat_stdev_us / s.lat_mean_us.max(1e-9);
        if cv >= self.max_cv && s.lat_mean_us >= self.cv_min_mean_ms * 1000.0 {
            return Some(format!("clat stdev/mean {cv:.2} >= {:.2}", self.max_cv));
        }
        let mean_ms = s.lat_mean_us / 1000.0;
        if mean_ms > self.max_mean_ms {
            return Some(format!(
                "mean clat {mean_ms:.1} ms > {:.1} ms",
                self.max_mean_ms
            ));
        }
        None
    }
}

/// The deepest step of `wl` whose p99.9 completion latency is at most `target_us`.
pub fn deepest_within(rows: &[Row], wl: Workload, target_us: f64) -> Option<&Row> {
    rows.iter()
        .filter(|r| r.workload == wl && r.carmine.errors == 0 && r.carmine.lat_p999_us <= target_us)
        .max_by_key(|r| r.depth)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(mean_us: f64, stdev_us: f64, p999_us: f64) -> StepStats {
        StepStats {
            ios: 1000,
            errors: 0,
            seconds: 1.0,
            iops: 1000.0,
            mib_s: 4.0,
            lat_mean_us: mean_us,
            lat_stdev_us: stdev_us,
            lat_p50_us: mean_us,
            lat_p99_us: p999_us,
            lat_p999_us: p999_us,
            lat_max_us: p999_us,
            verify_errors: 0,
            reads: None,
            writes: None,
        }
    }

    #[test]
    fn wide_or_slow_steps_stop_the_sweep() {
        let e = EarlyExit {
            max_cv: 0.5,
            max_mean_ms: 20.0,
            cv_min_mean_ms: 1.0,
        };
        assert_eq!(e.reason(&stats(2000.0, 400.0, 3000.0)), None);
        let wide = e.reason(&stats(2000.0, 1000.0, 3000.0)).unwrap();
        assert!(wide.contains("stdev/mean 0.50"), "{wide}");
        let slow = e.reason(&stats(25_000.0, 100.0, 30_000.0)).unwrap();
        assert!(slow.contains("25.0 ms > 20.0 ms"), "{slow}");
        // Wide but fast: microsecond jitter, not overload.
        assert_eq!(e.reason(&stats(40.0, 30.0, 300.0)), None);
    }

    #[test]
    fn latency_target_picks_the_deepest_step_under_it() {
        let row = |depth, p999| {
            Row::new(
                Workload::Randread,
                4096,
                depth,
                stats(100.0, 10.0, p999),
                None,
                Default::default(),
            )
        };
        let rows = vec![
            row(1, 100.0),
            row(16, 900.0),
            row(32, 1500.0),
            row(64, 800.0),
        ];
        assert_eq!(
            deepest_within(&rows, Workload::Randread, 1000.0).map(|r| r.depth),
            Some(64)
        );
        assert_eq!(
            deepest_within(&rows, Workload::Randread, 50.0).map(|r| r.depth),
            None
        );
        assert_eq!(
            deepest_within(&rows, Workload::Randwrite, 1e9).map(|r| r.depth),
            None
        );
    }
}
