//! Property tests: for random topologies, allowed sets and requests, placement either refuses
//! exactly when the request cannot fit, or hands out distinct allowed first threads shaped
//! the way the policy promises.

use super::tests::assert_valid;
use super::*;
use proptest::prelude::*;
use std::collections::BTreeMap;

/// Usable cores per socket, in socket order (the allocator's view).
fn pools(topo: &CpuTopology, allowed: Option<&[u32]>) -> Vec<Vec<u32>> {
    topo.physical_cores(allowed).into_values().collect()
}

fn share(reactors: u32, n: u32, s: u32) -> u32 {
    reactors / n + u32::from(s < reactors % n)
}

/// The spec, written independently of the allocator: does the request fit without reuse?
fn fits(policy: CpuPolicy, pools: &[Vec<u32>], osds: u32, r: u32) -> bool {
    let sizes: Vec<u32> = pools.iter().map(|p| p.len() as u32).collect();
    let n = sizes.len() as u32;
    if osds * r == 0 {
        return true;
    }
    match policy {
        CpuPolicy::Default => osds * r <= sizes.iter().sum::<u32>(),
        CpuPolicy::Osd => {
            n > 0
                && (0..n).all(|s| {
                    (0..osds).filter(|o| o % n == s).count() as u32 * r <= sizes[s as usize]
                })
        }
        CpuPolicy::Socket => n > 0 && (0..n).all(|s| osds * share(r, n, s) <= sizes[s as usize]),
    }
}

/// The shape each policy promises, on an allocation that fits.
fn check_shape(a: &Allocation, policy: CpuPolicy, pools: &[Vec<u32>], r: u32) {
    let socket_index: BTreeMap<u32, u32> = pools
        .iter()
        .enumerate()
        .flat_map(|(i, p)| p.iter().map(move |c| (*c, i as u32)))
        .collect();
    let n = pools.len() as u32;
    let mut usable: Vec<u32> = pools.iter().flatten().copied().collect();
    usable.sort_unstable();
    for (o, cpus) in a.iter() {
        match policy {
            CpuPolicy::Default => {
                let start = (o * r) as usize;
                assert_eq!(cpus, &usable[start..start + r as usize], "osd {o}");
            }
            CpuPolicy::Osd => assert!(cpus.iter().all(|c| socket_index[c] == o % n), "osd {o}"),
            CpuPolicy::Socket => {
                for s in 0..n {
                    let on_s = cpus.iter().filter(|c| socket_index[c] == s).count() as u32;
                    assert_eq!(on_s, share(r, n, s), "osd {o} socket {s}");
                }
            }
        }
    }
}

fn policy() -> impl Strategy<Value = CpuPolicy> {
    prop::sample::select(CpuPolicy::ALL.to_vec())
}

proptest! {
    #[test]
    fn allocations_either_fit_on_distinct_allowed_first_threads_or_are_refused(
        sockets in 1u32..4,
        cores in 1u32..12,
        smt in 1u32..3,
        mask in prop::option::of(prop::collection::vec(any::<bool>(), 72)),
        osds in 0u32..6,
        reactors in 0u32..6,
        policy in policy(),
        oversubscribe in any::<bool>(),
    ) {
        let topo = CpuTopology::synthetic(sockets, cores, smt);
        let allowed: Option<Vec<u32>> = mask.map(|m| {
            topo.cpus().iter().map(|c| c.id).filter(|id| m[*id as usize]).collect()
        });
        let allowed = allowed.as_deref();
        let pools = pools(&topo, allowed);
        let fit = fits(policy, &pools, osds, reactors);
        let any_core = pools.iter().any(|p| !p.is_empty());
        match allocate(&topo, policy, allowed, osds, reactors, oversubscribe) {
            Ok(a) => {
                prop_assert!(fit || (oversubscribe && any_core));
                prop_assert_eq!(a.oversubscribed, !fit);
                prop_assert_eq!(a.osds(), osds);
                for (_, cpus) in a.iter() {
                    prop_assert_eq!(cpus.len(), reactors as usize);
                    for c in cpus {
                        prop_assert!(topo.cpu(*c).is_some_and(|c| c.first_thread));
                        prop_assert!(allowed.is_none_or(|al| al.contains(c)));
                    }
                }
                if fit {
                    assert_valid(&topo, &a, osds, reactors);
                    check_shape(&a, policy, &pools, reactors);
                }
            }
            Err(e) => {
                prop_assert!(!fit, "refused a request that fits: {}", e);
                prop_assert!(!oversubscribe || !any_core, "refused while oversubscribing: {}", e);
                prop_assert!(matches!(e, CpuError::NotEnoughCores { .. }), "{}", e);
            }
        }
    }

    #[test]
    fn cpu_lists_round_trip_through_the_compact_form(ids in prop::collection::vec(0u32..300, 1..40)) {
        let text = format_cpu_list(&ids);
        let mut want = ids.clone();
        want.sort_unstable();
        want.dedup();
        prop_assert_eq!(parse_cpu_list(&text).unwrap(), want);
    }

    #[test]
    fn cpu_list_parsing_never_panics(s in "[0-9,\\- a-z]{0,20}") {
        let _ = parse_cpu_list(&s);
    }
}
