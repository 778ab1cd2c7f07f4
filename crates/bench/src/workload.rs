//! Closed-loop load generation: `depth` workers each keep one I/O in flight until the step
//! ends, recording completion latency after the ramp.

use crate::verify::{Verifier, BLOCK};
use bytes::Bytes;
use carmine_volume::Image;
use futures::future::join_all;
use hdrhistogram::Histogram;
use indicatif::ProgressBar;
use rand::{Rng, SeedableRng};
use rand_distr::Distribution as _;
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::future::Future;
use std::time::{Duration, Instant};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Randread,
    Randwrite,
    /// Random reads and writes mixed (`--rwmix-read` percent reads).
    Randrw,
    Seqread,
    Seqwrite,
}

impl Workload {
    /// Only writes.
    pub fn is_write(self) -> bool {
        matches!(self, Workload::Randwrite | Workload::Seqwrite)
    }
    /// Writes at least some of the time.
    pub fn writes(self) -> bool {
        self.is_write() || self == Workload::Randrw
    }
    pub fn is_random(self) -> bool {
        matches!(
            self,
            Workload::Randread | Workload::Randwrite | Workload::Randrw
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            Workload::Randread => "randread",
            Workload::Randwrite => "randwrite",
            Workload::Randrw => "randrw",
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
    /// Reads whose data was not what the volume last acknowledged (verify mode only).
    #[serde(default)]
    pub verify_errors: u64,
    /// A mixed workload's reads and writes apart (`None` unless the step had both).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reads: Option<SideStats>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub writes: Option<SideStats>,
}

impl StepStats {
    /// The step as one side of a mixed one.
    pub fn as_side(&self) -> SideStats {
        SideStats {
            ios: self.ios,
            iops: self.iops,
            lat_mean_us: self.lat_mean_us,
            lat_p50_us: self.lat_p50_us,
            lat_p99_us: self.lat_p99_us,
            lat_p999_us: self.lat_p999_us,
        }
    }
}

/// One side (reads or writes) of a mixed workload's step, as fio reports each.
#[derive(Clone, Debug, Serialize)]
pub struct SideStats {
    pub ios: u64,
    pub iops: f64,
    pub lat_mean_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_p999_us: f64,
}

/// How one I/O of a closed loop went: reads and writes are also counted apart, so that a
/// mixed workload reports each side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Io {
    Failed,
    Read,
    Write,
}

impl Io {
    pub fn of(ok: bool, write: bool) -> Io {
        match (ok, write) {
            (false, _) => Io::Failed,
            (true, false) => Io::Read,
            (true, true) => Io::Write,
        }
    }
}

fn histogram() -> Histogram<u64> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("valid bounds")
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
    Fut: Future<Output = Io>,
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
    Fut: Future<Output = Io>,
{
    let hist = RefCell::new(histogram());
    let sides = RefCell::new([histogram(), histogram()]);
    let errors = Cell::new(0u64);
    let start = Instant::now();
    let measure_from = start + ramp;
    let end = measure_from + run;
    let worker = |w: usize| {
        let (hist, sides, errors, op) = (&hist, &sides, &errors, &op);
        async move {
            let mut i = 0u64;
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let io = op(w, i).await;
                i += 1;
                if t0 >= measure_from {
                    let ns = t0.elapsed().as_nanos().max(1) as u64;
                    match io {
                        Io::Failed => errors.set(errors.get() + 1),
                        Io::Read | Io::Write => {
                            let _ = hist.borrow_mut().record(ns);
                            let _ = sides.borrow_mut()[(io == Io::Write) as usize].record(ns);
                        }
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
    let [reads, writes] = sides.into_inner();
    let side = |h: &Histogram<u64>| SideStats {
        ios: h.len(),
        iops: h.len() as f64 / seconds,
        lat_mean_us: us(h.mean()),
        lat_p50_us: us(h.value_at_quantile(0.5) as f64),
        lat_p99_us: us(h.value_at_quantile(0.99) as f64),
        lat_p999_us: us(h.value_at_quantile(0.999) as f64),
    };
    let mixed = !reads.is_empty() && !writes.is_empty();
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
        verify_errors: 0,
        reads: mixed.then(|| side(&reads)),
        writes: mixed.then(|| side(&writes)),
    }
}

/// Where random I/O lands: uniformly, or skewed (fio's `random_distribution`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Distribution {
    Uniform,
    /// Zipf with exponent θ: a few blocks take most of the I/O.
    Zipf(f64),
    /// Normal around the middle of the volume, with this stdev in percent of it.
    Normal(f64),
}

impl std::str::FromStr for Distribution {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, arg) = s.split_once(':').unwrap_or((s, ""));
        let num = |default: f64| -> Result<f64, String> {
            if arg.is_empty() {
                return Ok(default);
            }
            arg.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
                .ok_or_else(|| format!("{kind}: {arg:?} is not a positive number"))
        };
        match kind {
            "uniform" if arg.is_empty() => Ok(Distribution::Uniform),
            "zipf" => Ok(Distribution::Zipf(num(1.2)?)),
            "normal" => Ok(Distribution::Normal(num(10.0)?.min(100.0))),
            _ => Err(format!(
                "unknown distribution {s:?} (uniform, zipf[:THETA], normal[:STDEV_PCT])"
            )),
        }
    }
}

impl std::fmt::Display for Distribution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Distribution::Uniform => write!(f, "uniform"),
            Distribution::Zipf(t) => write!(f, "zipf:{t}"),
            Distribution::Normal(p) => write!(f, "normal:{p}"),
        }
    }
}

impl Distribution {
    /// The same distribution as fio's `--random_distribution`, if not uniform.
    pub fn fio_arg(&self) -> Option<String> {
        (*self != Distribution::Uniform).then(|| self.to_string())
    }
}

/// The random-access shape of a run: the read share of `randrw` and where I/O lands.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Mix {
    pub read_pct: u32,
    pub distribution: Distribution,
}

impl Default for Mix {
    fn default() -> Self {
        Mix {
            read_pct: 70,
            distribution: Distribution::Uniform,
        }
    }
}

impl Mix {
    /// The read percentage fio needs for `wl` (only mixed workloads have one).
    pub fn read_pct_of(&self, wl: Workload) -> Option<u32> {
        (wl == Workload::Randrw).then_some(self.read_pct)
    }
}

/// Draws block numbers in `0..blocks` from a distribution. Skewed draws are ranks; a fixed
/// bijection scatters them over the volume (as fio hashes them), so the hot blocks are not
/// all at the front.
pub struct BlockPicker {
    blocks: u64,
    zipf: Option<rand_distr::Zipf<f64>>,
    normal: Option<rand_distr::Normal<f64>>,
    stride: u64,
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl BlockPicker {
    pub fn new(blocks: u64, dist: Distribution) -> Self {
        let blocks = blocks.max(1);
        // Any stride coprime with `blocks` makes rank → rank * stride mod blocks a bijection.
        let mut stride = 0x9E37_79B9_7F4A_7C15 % blocks;
        while stride == 0 || gcd(stride, blocks) != 1 {
            stride += 1;
        }
        let n = blocks as f64;
        BlockPicker {
            blocks,
            zipf: match dist {
                Distribution::Zipf(theta) => rand_distr::Zipf::new(n, theta).ok(),
                _ => None,
            },
            normal: match dist {
                Distribution::Normal(pct) => {
                    rand_distr::Normal::new(n / 2.0, (n * pct / 100.0).max(1.0)).ok()
                }
                _ => None,
            },
            stride,
        }
    }

    pub fn pick(&self, rng: &mut impl Rng) -> u64 {
        let rank = if let Some(z) = &self.zipf {
            // Zipf yields 1..=n.
            (z.sample(rng) as u64).saturating_sub(1)
        } else if let Some(nd) = &self.normal {
            // Out-of-range draws are clamped to the edges, as fio does.
            nd.sample(rng).clamp(0.0, (self.blocks - 1) as f64) as u64
        } else {
            return rng.random_range(0..self.blocks);
        };
        // Shifted too, so rank 0 (the hottest) is not block 0.
        let rank = rank.min(self.blocks - 1) as u128;
        ((rank * self.stride as u128 + self.blocks as u128 / 3) % self.blocks as u128) as u64
    }
}

/// What one step drives: `jobs` independent jobs per volume, each keeping `depth` I/Os in
/// flight (fio's numjobs and iodepth), so `images × jobs × depth` in flight in all.
pub struct Load<'a> {
    pub images: &'a [Image],
    pub jobs: usize,
    pub wl: Workload,
    pub mix: Mix,
    pub bs: u64,
    pub depth: usize,
    /// Verify mode: writes carry checkable patterns and reads are checked against them.
    pub verifiers: Option<&'a [Verifier]>,
}

/// One workload step against a volume, uniform and unverified (the demo's and tests' form).
pub async fn run_on_image(
    image: &Image,
    wl: Workload,
    bs: u64,
    depth: usize,
    ramp: Duration,
    run: Duration,
) -> StepStats {
    let images = std::slice::from_ref(image).to_vec();
    let load = Load {
        images: &images,
        jobs: 1,
        wl,
        mix: Mix::default(),
        bs,
        depth,
        verifiers: None,
    };
    run_load(&load, ramp, run, &ProgressBar::hidden()).await
}

/// Runs one step of `load`, with live progress on `progress`. Sequential jobs each stream
/// through their volume from their own starting point (job k of n starts k/n of the way in),
/// their `depth` workers sharing the job's cursor like one reader with a deep queue.
pub async fn run_load(
    load: &Load<'_>,
    ramp: Duration,
    run: Duration,
    progress: &ProgressBar,
) -> StepStats {
    let bs = load.bs;
    let per_volume = load.jobs.max(1) * load.depth;
    let workers = load.images.len() * per_volume;
    let blocks: Vec<u64> = load.images.iter().map(|i| (i.size() / bs).max(1)).collect();
    let pickers: Vec<BlockPicker> = blocks
        .iter()
        .map(|&b| BlockPicker::new(b, load.mix.distribution))
        .collect();
    let data = Bytes::from(vec![0xa5u8; bs as usize]);
    // One cursor per (volume, job).
    let cursors: Vec<Cell<u64>> = (0..load.images.len() * load.jobs.max(1))
        .map(|c| {
            let job = (c % load.jobs.max(1)) as u64;
            Cell::new(job * blocks[c / load.jobs.max(1)] / load.jobs.max(1) as u64)
        })
        .collect();
    let rngs: Vec<RefCell<rand::rngs::SmallRng>> = (0..workers)
        .map(|w| RefCell::new(rand::rngs::SmallRng::seed_from_u64(w as u64 + 1)))
        .collect();
    let verify_errors = Cell::new(0u64);
    let blocks = &blocks;
    let mut stats = closed_loop_observed(
        workers,
        ramp,
        run,
        bs,
        |w, _| {
            let vol = w / per_volume;
            let cursor = &cursors[w / load.depth];
            let (image, picker, rng) = (&load.images[vol], &pickers[vol], &rngs[w]);
            let verifier = load.verifiers.map(|v| &v[vol]);
            let data = data.clone();
            let verify_errors = &verify_errors;
            async move {
                let write = match load.wl {
                    Workload::Randrw => rng.borrow_mut().random_range(0..100) >= load.mix.read_pct,
                    wl => wl.is_write(),
                };
                let next_block = || {
                    if load.wl.is_random() {
                        picker.pick(&mut *rng.borrow_mut())
                    } else {
                        let b = cursor.get();
                        cursor.set((b + 1) % blocks[vol]);
                        b
                    }
                };
                let Some(v) = verifier else {
                    let off = next_block() * bs;
                    let ok = if write {
                        image.write(off, data).await.is_ok()
                    } else {
                        image.read(off, bs).await.is_ok()
                    };
                    return Io::of(ok, write);
                };
                let count = bs / BLOCK;
                // Blocks another worker is writing (or reading, for a write) are off limits
                // until it finishes, so every read has exactly one expected content.
                let first = loop {
                    if let Some(first) = (0..64)
                        .map(|_| next_block() * bs / BLOCK)
                        .find(|&first| v.try_claim(first, count, write))
                    {
                        break first;
                    }
                    carmine_reactor::sleep(Duration::from_micros(20)).await;
                };
                if write {
                    let (payload, gens) = v.payload(first, count);
                    let ok = image.write(first * BLOCK, payload).await.is_ok();
                    v.finish_write(first, &gens, ok);
                    Io::of(ok, true)
                } else {
                    let got = image.read(first * BLOCK, bs).await;
                    v.finish_read(first, count);
                    match got {
                        Ok(buf) => {
                            if let Err(e) = v.check(first, &buf) {
                                if verify_errors.get() == 0 {
                                    eprintln!("verify: {e}");
                                }
                                verify_errors.set(verify_errors.get() + 1);
                            }
                            Io::Read
                        }
                        Err(_) => Io::Failed,
                    }
                }
            }
        },
        progress,
    )
    .await;
    stats.verify_errors = verify_errors.get();
    stats
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn a_mixed_loop_reports_reads_and_writes_apart_and_a_pure_one_does_not() {
        let run = |write_every: u64| {
            carmine_reactor::block_on(closed_loop(
                2,
                Duration::ZERO,
                Duration::from_millis(200),
                4096,
                |_, i| async move {
                    let write = write_every > 0 && i % write_every == 0;
                    // Writes take longer, so the sides' latencies differ.
                    let pause = if write { 2_000 } else { 200 };
                    carmine_reactor::sleep(Duration::from_micros(pause)).await;
                    Io::of(true, write)
                },
            ))
        };
        let mixed = run(4);
        let (r, w) = (mixed.reads.unwrap(), mixed.writes.unwrap());
        assert_eq!(r.ios + w.ios, mixed.ios);
        assert!(
            r.ios > w.ios && w.ios > 0,
            "{} reads, {} writes",
            r.ios,
            w.ios
        );
        assert!(w.lat_mean_us > r.lat_mean_us, "{w:?} vs {r:?}");
        let pure = run(0);
        assert!(pure.reads.is_none() && pure.writes.is_none());
    }

    fn histogram(dist: Distribution, blocks: u64, draws: usize) -> Vec<u64> {
        let picker = BlockPicker::new(blocks, dist);
        let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
        let mut hits = vec![0u64; blocks as usize];
        for _ in 0..draws {
            let b = picker.pick(&mut rng);
            assert!(b < blocks);
            hits[b as usize] += 1;
        }
        hits
    }

    /// Share of all draws that land on the hottest `frac` of blocks.
    fn top_share(mut hits: Vec<u64>, frac: f64) -> f64 {
        let total: u64 = hits.iter().sum();
        hits.sort_unstable_by(|a, b| b.cmp(a));
        let top = (hits.len() as f64 * frac) as usize;
        hits[..top].iter().sum::<u64>() as f64 / total as f64
    }

    #[test]
    fn distributions_skew_as_named() {
        let uniform = top_share(histogram(Distribution::Uniform, 1000, 100_000), 0.1);
        let zipf = top_share(histogram(Distribution::Zipf(1.2), 1000, 100_000), 0.1);
        let normal = top_share(histogram(Distribution::Normal(5.0), 1000, 100_000), 0.1);
        assert!(uniform < 0.15, "uniform: top 10% of blocks got {uniform}");
        assert!(zipf > 0.7, "zipf 1.2: top 10% of blocks got {zipf}");
        assert!(normal > 0.5, "normal 5%: top 10% of blocks got {normal}");
        // The hot blocks are scattered, not the first ones.
        let hits = histogram(Distribution::Zipf(1.2), 1000, 10_000);
        assert!(hits[0] < hits.iter().copied().max().unwrap());
    }

    #[test]
    fn distribution_names_parse_and_print_as_fio_spells_them() {
        let d: Distribution = "zipf:0.9".parse().unwrap();
        assert_eq!(d, Distribution::Zipf(0.9));
        assert_eq!(d.fio_arg().as_deref(), Some("zipf:0.9"));
        assert_eq!("zipf".parse(), Ok(Distribution::Zipf(1.2)));
        assert_eq!("normal".parse(), Ok(Distribution::Normal(10.0)));
        assert_eq!(Distribution::Uniform.fio_arg(), None);
        assert!("zipf:-1".parse::<Distribution>().is_err());
        assert!("pareto".parse::<Distribution>().is_err());
        assert!("uniform:3".parse::<Distribution>().is_err());
    }

    #[test]
    fn a_picker_over_one_block_always_picks_it() {
        for d in [
            Distribution::Uniform,
            Distribution::Zipf(1.1),
            Distribution::Normal(50.0),
        ] {
            assert!(histogram(d, 1, 100).iter().sum::<u64>() == 100);
        }
    }
}
