//! Closed-loop load generation: `depth` workers each keep one I/O in flight until the step
//! ends, recording completion latency after the ramp.

use bytes::Bytes;
use carmine_volume::Image;
use futures::future::join_all;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Randread,
    Randwrite,
    Seqread,
    Seqwrite,
}

impl Workload {
    pub fn is_write(self) -> bool {
        matches!(self, Workload::Randwrite | Workload::Seqwrite)
    }
    pub fn is_random(self) -> bool {
        matches!(self, Workload::Randread | Workload::Randwrite)
    }
    pub fn name(self) -> &'static str {
        match self {
            Workload::Randread => "randread",
            Workload::Randwrite => "randwrite",
            Workload::Seqread => "seqread",
            Workload::Seqwrite => "seqwrite",
        }
    }
}

/// Latency and throughput of one step.
#[derive(Clone, Debug, Serialize)]
pub struct StepStats {
    pub ios: u64,
    pub errors: u64,
    pub seconds: f64,
    pub iops: f64,
    pub mib_s: f64,
    pub lat_mean_us: f64,
    pub lat_stdev_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
    pub lat_max_us: f64,
}

/// Runs `depth` workers calling `op(worker, i)` until `ramp + run` has passed.
pub async fn closed_loop<F, Fut>(
    depth: usize,
    ramp: Duration,
    run: Duration,
    bytes_per_io: u64,
    op: F,
) -> StepStats
where
    F: Fn(usize, u64) -> Fut,
    Fut: Future<Output = bool>,
{
    closed_loop_observed(depth, ramp, run, bytes_per_io, op, &ProgressBar::hidden()).await
}

/// `closed_loop`, showing live IOPS and the step's progress on `progress` four times a second.
pub async fn closed_loop_observed<F, Fut>(
    depth: usize,
    ramp: Duration,
    run: Duration,
    bytes_per_io: u64,
    op: F,
    progress: &ProgressBar,
) -> StepStats
where
    F: Fn(usize, u64) -> Fut,
    Fut: Future<Output = bool>,
{
    let hist = RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds"),
    );
    let errors = Cell::new(0u64);
    let start = Instant::now();
    let measure_from = start + ramp;
    let end = measure_from + run;
    let worker = |w: usize| {
        let (hist, errors, op) = (&hist, &errors, &op);
        async move {
            let mut i = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let ok = op(w, i).await;
                i += 1;
                if t0 >= measure_from {
                    if ok {
                        let _ = hist
                            .borrow_mut()
                            .record(t0.elapsed().as_nanos().max(1) as u64);
                    } else {
                        errors.set(errors.get() + 1);
                    }
                }
            }
        }
    };
    let total = (ramp + run).as_secs_f64().max(1e-9);
    progress.set_length(1000);
    let ticker = async {
        let label = progress.message();
        loop {
            let now = Instant::now();
            if now >= end {
                break;
            }
            carmine_reactor::sleep(Duration::from_millis(250).min(end - now)).await;
            let measured = Instant::now()
                .saturating_duration_since(measure_from)
                .as_secs_f64();
            let iops = if measured > 0.0 {
                hist.borrow().len() as f64 / measured
            } else {
                0.0
            };
            progress.set_position(
                ((start.elapsed().as_secs_f64() / total) * 1000.0).min(1000.0) as u64,
            );
            progress.set_message(format!("{label}: {iops:.0} IOPS"));
        }
        progress.set_message(label);
    };
    futures::future::join(join_all((0..depth).map(worker)), ticker).await;
    let seconds = (Instant::now() - measure_from).as_secs_f64().max(1e-9);
    let h = hist.into_inner();
    let us = |ns: f64| ns / 1000.0;
    StepStats {
        ios: h.len(),
        errors: errors.get(),
        seconds,
        iops: h.len() as f64 / seconds,
        mib_s: h.len() as f64 * bytes_per_io as f64 / seconds / (1 << 20) as f64,
        lat_mean_us: us(h.mean()),
        lat_stdev_us: us(h.stdev()),
        lat_p50_us: us(h.value_at_quantile(0.5) as f64),
        lat_p99_us: us(h.value_at_quantile(0.99) as f64),
        lat_p999_us: us(h.value_at_quantile(0.999) as f64),
        lat_max_us: us(h.max() as f64),
    }
}

/// One workload step against a volume. Sequential workers share one cursor, so together they
/// stream through the volume like a single sequential reader with a deep queue.
pub async fn run_on_image(
    image: &Image,
    wl: Workload,
    bs: u64,
    depth: usize,
    ramp: Duration,
    run: Duration,
) -> StepStats {
    run_on_image_observed(image, wl, bs, depth, ramp, run, &ProgressBar::hidden()).await
}

/// `run_on_image` with live progress on `progress`.
pub async fn run_on_image_observed(
    image: &Image,
    wl: Workload,
    bs: u64,
    depth: usize,
    ramp: Duration,
    run: Duration,
    progress: &ProgressBar,
) -> StepStats {
    let blocks = (image.size() / bs).max(1);
    let data = Bytes::from(vec![0xa5u8; bs as usize]);
    let cursor = Cell::new(0u64);
    let rngs: Vec<RefCell<rand::rngs::SmallRng>> = (0..depth)
        .map(|w| RefCell::new(rand::rngs::SmallRng::seed_from_u64(w as u64 + 1)))
        .collect();
    closed_loop_observed(
        depth,
        ramp,
        run,
        bs,
        |w, _| {
            let block = if wl.is_random() {
                rngs[w].borrow_mut().random_range(0..blocks)
            } else {
                let b = cursor.get();
                cursor.set((b + 1) % blocks);
                b
            };
            let off = block * bs;
            let data = data.clone();
            async move {
                if wl.is_write() {
                    image.write(off, data).await.is_ok()
                } else {
                    image.read(off, bs).await.is_ok()
                }
            }
        },
        progress,
    )
    .await
}
