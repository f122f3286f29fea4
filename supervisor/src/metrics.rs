//! `/metrics`: the `layad_*` Prometheus metrics, their buckets and the helpers that record them;
//! pool and worker gauges are read from the backend's status at scrape time.
//!
//! prometheus-client rather than a hand-written exposition: label escaping, histogram bucket
//! layout and the OpenMetrics text format are easy to get subtly wrong, and the crate is small
//! (no default features, no C) and maintained by the Prometheus project.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use laya::routing::CheckpointName;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use crate::backend::Backend;
use crate::decisions::Timings;
use crate::status::{JobClass, WorkerState};

/// The `Content-Type` of [`Metrics::render`]'s output.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Labels of `layad_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    /// HTTP status code.
    status: u16,
    /// Routed checkpoint, empty when the request failed before routing.
    checkpoint: String,
    /// Pool that ran it, empty when none did.
    pool: String,
}

/// Labels of `layad_batch_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BatchLabels {
    /// HTTP status code.
    status: u16,
}

/// A `checkpoint` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CheckpointLabel {
    checkpoint: String,
}

/// A `pool` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    pool: String,
}

/// `pool` and `class` labels (the job's class: question count and length band).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolClassLabels {
    pool: String,
    class: String,
}

/// Every metric layad exports.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    request_duration: Family<CheckpointLabel, Histogram>,
    prepare_duration: Histogram,
    queue_wait: Family<PoolClassLabels, Histogram>,
    device_duration: Family<PoolLabel, Histogram>,
    batch_requests: Family<BatchLabels, Counter>,
}

/// Latency buckets from 0.5 ms to about 16 s, doubling.
fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

impl Metrics {
    /// The metrics, with the backend's pools and workers read at every scrape.
    pub fn new(backend: Arc<dyn Backend>) -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "layad_requests",
            "POST /v1/systemone answers by status, routed checkpoint and pool",
            requests.clone(),
        );
        let request_duration = Family::<CheckpointLabel, Histogram>::new_with_constructor(latency_buckets as fn() -> _);
        registry.register_with_unit(
            "layad_request_duration",
            "POST /v1/systemone time from its headers being read to its answer being ready",
            Unit::Seconds,
            request_duration.clone(),
        );
        // Host work is expected well under a millisecond: buckets from 25 µs.
        let prepare_duration = Histogram::new(exponential_buckets(0.000_025, 2.0, 16));
        registry.register_with_unit(
            "layad_prepare_duration",
            "Host work before the worker: decoding, parsing, routing, validation, tokenization",
            Unit::Seconds,
            prepare_duration.clone(),
        );
        let queue_wait = Family::<PoolClassLabels, Histogram>::new_with_constructor(latency_buckets as fn() -> _);
        registry.register_with_unit(
            "layad_queue_wait",
            "Time a job waited for a worker, by pool and job class (single-64: one question of at most 64 tokens, …)",
            Unit::Seconds,
            queue_wait.clone(),
        );
        let device_duration = Family::<PoolLabel, Histogram>::new_with_constructor(latency_buckets as fn() -> _);
        registry.register_with_unit(
            "layad_device_duration",
            "Time a worker spent on a job's forward pass",
            Unit::Seconds,
            device_duration.clone(),
        );
        let batch_requests = Family::<BatchLabels, Counter>::default();
        registry.register(
            "layad_batch_requests",
            "POST /v1/systemone/batch answers by status (each state's job also counts in layad_queue_wait and layad_device_duration)",
            batch_requests.clone(),
        );
        registry.register_collector(Box::new(BackendCollector { backend }));
        Self {
            registry,
            requests,
            request_duration,
            prepare_duration,
            queue_wait,
            device_duration,
            batch_requests,
        }
    }

    /// Records one `POST /v1/systemone` answer.
    pub fn record_decision(
        &self,
        status: u16,
        checkpoint: Option<CheckpointName>,
        pool: Option<&str>,
        total: Duration,
        timings: &Timings,
    ) {
        let checkpoint = checkpoint.map_or("", CheckpointName::as_str).to_owned();
        let pool = pool.unwrap_or("").to_owned();
        self.requests
            .get_or_create(&RequestLabels {
                status,
                checkpoint: checkpoint.clone(),
                pool: pool.clone(),
            })
            .inc();
        self.request_duration
            .get_or_create(&CheckpointLabel { checkpoint })
            .observe(total.as_secs_f64());
        if let Some(prepare) = timings.prepare {
            self.prepare_duration.observe(prepare.as_secs_f64());
        }
        if let Some(queue) = timings.queue {
            let labels = PoolClassLabels {
                pool: pool.clone(),
                class: timings.class.map_or("", JobClass::name).to_owned(),
            };
            self.queue_wait.get_or_create(&labels).observe(queue.as_secs_f64());
        }
        let label = PoolLabel { pool };
        if let Some(device) = timings.device {
            self.device_duration.get_or_create(&label).observe(device.as_secs_f64());
        }
    }

    /// Records one `POST /v1/systemone/batch` answer and the queue wait and device time of each of
    /// its jobs (`(pool, class, queue wait, device time)`).
    pub fn record_batch(
        &self,
        status: u16,
        prepare: Option<Duration>,
        jobs: &[(String, JobClass, Duration, Duration)],
    ) {
        self.batch_requests.get_or_create(&BatchLabels { status }).inc();
        if let Some(prepare) = prepare {
            self.prepare_duration.observe(prepare.as_secs_f64());
        }
        for (pool, class, queue, device) in jobs {
            let labels = PoolClassLabels {
                pool: pool.clone(),
                class: class.name().to_owned(),
            };
            self.queue_wait.get_or_create(&labels).observe(queue.as_secs_f64());
            self.device_duration
                .get_or_create(&PoolLabel { pool: pool.clone() })
                .observe(device.as_secs_f64());
        }
    }

    /// The OpenMetrics text exposition (see [`CONTENT_TYPE`]).
    pub fn render(&self) -> Result<String, fmt::Error> {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// Pool and worker gauges and counters, read from the backend at each scrape.
struct BackendCollector {
    backend: Arc<dyn Backend>,
}

impl fmt::Debug for BackendCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BackendCollector")
    }
}

/// All worker states, so a state with no workers reads 0 rather than vanishing.
const WORKER_STATES: [WorkerState; 7] = [
    WorkerState::Starting,
    WorkerState::Ready,
    WorkerState::Restarting,
    WorkerState::Draining,
    WorkerState::Stopped,
    WorkerState::Failed,
    WorkerState::Unloaded,
];

impl Collector for BackendCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), fmt::Error> {
        let status = self.backend.status();
        let pools = &status.pools;
        let gauge = |encoder: &mut DescriptorEncoder, name: &str, help: &str, values: Vec<(Vec<(&str, &str)>, i64)>| {
            let gauge_type = ConstGauge::new(0i64).metric_type();
            let mut metric = encoder.encode_descriptor(name, help, None, gauge_type)?;
            for (labels, value) in values {
                ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
            }
            Ok::<(), fmt::Error>(())
        };
        gauge(
            &mut encoder,
            "layad_queue_depth",
            "Requests waiting for a worker, per pool",
            pools
                .iter()
                .map(|p| (vec![("pool", p.name.as_str())], p.queue_depth as i64))
                .collect(),
        )?;
        gauge(
            &mut encoder,
            "layad_in_flight",
            "Jobs running on a pool's workers",
            pools
                .iter()
                .map(|p| (vec![("pool", p.name.as_str())], p.in_flight as i64))
                .collect(),
        )?;
        gauge(
            &mut encoder,
            "layad_pool_degraded",
            "1 when a pool is degraded (e.g. a worker crash loop), else 0",
            pools
                .iter()
                .map(|p| (vec![("pool", p.name.as_str())], i64::from(p.degraded.is_some())))
                .collect(),
        )?;
        {
            // Seconds, Prometheus's base unit (a float gauge, so sub-millisecond backlogs stay visible).
            let mut backlog = encoder.encode_descriptor(
                "layad_pool_backlog",
                "Expected wait before a new job could start: estimated queued and running work per ready worker",
                Some(&Unit::Seconds),
                ConstGauge::new(0f64).metric_type(),
            )?;
            for pool in pools {
                let labels = [("pool", pool.name.as_str())];
                ConstGauge::new(pool.backlog.as_secs_f64()).encode(backlog.encode_family(&labels)?)?;
            }
        }
        gauge(
            &mut encoder,
            "layad_pool_unavailable",
            "1 when a pool's device does not exist on this machine (its worker said so), else 0",
            pools
                .iter()
                .map(|p| (vec![("pool", p.name.as_str())], i64::from(p.unavailable.is_some())))
                .collect(),
        )?;
        gauge(
            &mut encoder,
            "layad_workers",
            "Workers per pool and state",
            pools
                .iter()
                .flat_map(|p| {
                    WORKER_STATES.into_iter().map(move |state| {
                        let count = p.workers.iter().filter(|w| w.state == state).count() as i64;
                        (vec![("pool", p.name.as_str()), ("state", state.as_str())], count)
                    })
                })
                .collect(),
        )?;
        gauge(
            &mut encoder,
            "layad_worker_cpu_kernels",
            "1 per CPU worker, labelled with the SIMD kernels its matrix products run on",
            pools
                .iter()
                .flat_map(|p| {
                    p.workers.iter().filter_map(move |w| {
                        let kernels = w.engine.cpu_kernels.as_deref()?;
                        Some((
                            vec![
                                ("pool", p.name.as_str()),
                                ("worker", w.id.as_str()),
                                ("kernels", kernels),
                            ],
                            1,
                        ))
                    })
                })
                .collect(),
        )?;
        let counter_type = ConstCounter::new(0u64).metric_type();
        {
            let mut restarts = encoder.encode_descriptor(
                "layad_worker_restarts",
                "Times a worker process was restarted",
                None,
                counter_type,
            )?;
            for pool in pools {
                for worker in &pool.workers {
                    let labels = [("pool", pool.name.as_str()), ("worker", worker.id.as_str())];
                    ConstCounter::new(worker.restarts).encode(restarts.encode_family(&labels)?)?;
                }
            }
        }
        {
            let mut routed = encoder.encode_descriptor(
                "layad_routed",
                "Jobs placed on a pool, by route: preferred, spilled (in from another pool), fallback",
                None,
                counter_type,
            )?;
            for pool in pools {
                for (route, count) in [
                    ("preferred", pool.routed.preferred),
                    ("spilled", pool.routed.spilled),
                    ("fallback", pool.routed.fallback),
                ] {
                    let labels = [("pool", pool.name.as_str()), ("route", route)];
                    ConstCounter::new(count).encode(routed.encode_family(&labels)?)?;
                }
            }
        }
        {
            let mut speed = encoder.encode_descriptor(
                "layad_pool_speed_factor",
                "How much longer than normal a pool's forwards take now, as the scheduler estimates (1: normal speed)",
                None,
                ConstGauge::new(0f64).metric_type(),
            )?;
            for pool in pools {
                let labels = [("pool", pool.name.as_str())];
                ConstGauge::new(pool.speed.factor).encode(speed.encode_family(&labels)?)?;
            }
        }
        {
            let mut changed = encoder.encode_descriptor(
                "layad_pool_speed_changed",
                "Unix time when a pool's speed factor last changed (0: never)",
                Some(&Unit::Seconds),
                ConstGauge::new(0f64).metric_type(),
            )?;
            for pool in pools {
                let labels = [("pool", pool.name.as_str())];
                let at = pool
                    .speed
                    .since
                    .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
                    .map_or(0.0, |d| d.as_secs_f64());
                ConstGauge::new(at).encode(changed.encode_family(&labels)?)?;
            }
        }
        {
            let mut changes = encoder.encode_descriptor(
                "layad_pool_speed_changes",
                "Times a pool's speed factor changed (its device slowed or recovered)",
                None,
                counter_type,
            )?;
            for pool in pools {
                let labels = [("pool", pool.name.as_str())];
                ConstCounter::new(pool.speed.changes).encode(changes.encode_family(&labels)?)?;
            }
        }
        {
            let mut spilled_out = encoder.encode_descriptor(
                "layad_spilled_out",
                "Jobs that preferred a pool but were expected to finish earlier on another",
                None,
                counter_type,
            )?;
            for pool in pools {
                let labels = [("pool", pool.name.as_str())];
                ConstCounter::new(pool.spilled_out).encode(spilled_out.encode_family(&labels)?)?;
            }
        }
        {
            let mut taken = encoder.encode_descriptor(
                "layad_taken_over",
                "Jobs an idle worker took from another pool's queue: direction in (taken by this pool), out (taken from it)",
                None,
                counter_type,
            )?;
            for pool in pools {
                for (direction, count) in [("in", pool.taken.0), ("out", pool.taken.1)] {
                    let labels = [("pool", pool.name.as_str()), ("direction", direction)];
                    ConstCounter::new(count).encode(taken.encode_family(&labels)?)?;
                }
            }
        }
        let mut batches = encoder.encode_descriptor(
            "layad_batched_forwards",
            "Forward passes that carried more than one job",
            None,
            counter_type,
        )?;
        for pool in pools {
            let labels = [("pool", pool.name.as_str())];
            ConstCounter::new(pool.batches.0).encode(batches.encode_family(&labels)?)?;
        }
        Ok(())
    }
}
