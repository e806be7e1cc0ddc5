//! Benchmark: raw records/s through the pre-filter, against a bare rdkafka
//! consumer reading the same topic in the same run; and the per-record cost
//! of the JSON transform in Wasm against the same crate compiled natively,
//! making every event and told the one type kept (`transform-scope`).
//!
//! cargo bench -p laurel --bench prefilter      (LAUREL_BENCH_RECORDS=900000,
//!                                               LAUREL_BENCH_ROUNDS=2,
//!                                               LAUREL_BENCH_CPU=1)
//!
//! - The raw topic (24 partitions; every record fits the mock cluster's
//!   retention) is filled first, in this process, by librdkafka's mock
//!   cluster: JSON navigator records, 0.6% of them finished trips that an
//!   award sums, the rest routes that no award counts.
//! - Bare: this binary again, as a child pinned to one core (`taskset -c
//!   CPU`), consuming the topic through one `StreamConsumer` stream (as
//!   the pre-filter reads a batch; `LAUREL_BENCH_BARE_RECV=1`: `recv` per
//!   record) with the pre-filter's fetch settings, and dropping every
//!   record; then the same through librdkafka's batch call, 64 records at
//!   a time as the pre-filter reads them, printed beside. Laurel: the built `laurel serve --roles prefilter`, pinned to
//!   the same core, running one pipeline (`JsonTransform` in Wasm) over the
//!   same topic. Each is timed from its first progress to its last record
//!   (the consumer group's join is not throughput); the pre-filter's by
//!   its committed offsets, polled every 20 ms.
//! - The kept events on `events.bss` are counted: exactly the trips.
//!
//! Uses the database `laurel_bench_prefilter` on 127.0.0.1 (dropped and
//! made anew each run; LAUREL_BENCH_SERVER_URL to change the server).

use std::collections::BTreeSet;
use std::hint::black_box;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use laurel::kafka::{self, LocalBroker};
use laurel::registry::Registry;
use laurel::runtime::{Limits, RawRecord, Runtime, TransformInstance};
use laurel::store::Store;
use laurel_guest::Transform as _;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

#[path = "support/row.rs"]
mod row;
use row::{row, spread, thousands};

const TOPIC: &str = "raw.navigator";
const PARTITIONS: i32 = 24;
const PIPELINE: &str = "navigator";

const FIELDS: &str = r#"{"fields": {"user_id": "/user", "type": "/event",
  "authorized": {"const": true}, "occurred_at": "/ts", "payload": {"distance_m": "/distance"}}}"#;

const AWARD: &str = r#"{"id": "driver", "title": "Driver",
  "objectives": [{"id": "navi",
    "filters": [{"name": "SourceFilter", "config": {"sources": ["bss"]}},
                {"name": "EventTypeFilter", "config": {"types": ["navi.trip_finished"]}}],
    "rule": {"name": "SumFieldRule", "config": {"field": "distance_m", "counter": "metres"}},
    "progress_counter": "metres"}],
  "strategy": {"goal": 10, "strategy": [{"objective_id": "navi", "normalization_factor": 0.001}]}}"#;

/// Record `n`: a finished trip for 6 in 1000, a built route otherwise.
fn record(n: usize) -> String {
    let event = if n % 1000 < 6 {
        "navi.trip_finished"
    } else {
        "navi.route_built"
    };
    format!(
        r#"{{"user":"u-{}","event":"{event}","ts":{},"distance":{},"app":"navigator","build":"26.11.3"}}"#,
        (n * 7919) % 50_000,
        1_764_583_200_000_i64 + n as i64,
        100 + n % 900
    )
}

fn trips(count: usize) -> usize {
    (0..count).filter(|n| n % 1000 < 6).count()
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    // The bare consumer, as a child of this benchmark.
    if let Ok(brokers) = std::env::var("LAUREL_BENCH_BARE_BROKERS") {
        let count = env("LAUREL_BENCH_RECORDS", 900_000);
        bare(&brokers, count);
        return;
    }
    let count = env("LAUREL_BENCH_RECORDS", 900_000);
    let rounds = env("LAUREL_BENCH_ROUNDS", 2).max(1);
    let cpu = env("LAUREL_BENCH_CPU", 1);
    transform_cost();
    let server = std::env::var("LAUREL_BENCH_SERVER_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut ratios = Vec::new();
        let (mut bares, mut laurels) = (Vec::new(), Vec::new());
        for round in 1..=rounds {
            let (bare, laurel) = measure(&server, count, cpu).await;
            let ratio = laurel / bare;
            ratios.push(ratio);
            bares.push(bare);
            laurels.push(laurel);
            println!(
                "Round {round}: bare consumer {bare:>8.0} records/s; pre-filter {laurel:>8.0} records/s: ratio {ratio:.2}"
            );
        }
        ratios.sort_by(f64::total_cmp);
        println!(
            "Pre-filter/bare over {rounds} rounds: lowest {:.2}, median {:.2}, highest {:.2}",
            ratios[0],
            ratios[ratios.len() / 2],
            ratios[ratios.len() - 1]
        );
        row(
            "prefilter",
            &format!("raw records -> JsonTransform in Wasm -> kept events, {count} records, pinned to one core (baseline: a bare rdkafka consumer, pinned the same)"),
            &spread(&laurels, thousands, "records/s"),
            &spread(&bares, thousands, "records/s"),
            &spread(&ratios, |r| format!("{r:.2}"), ""),
            ">= 0.5 and >= 150K records/s",
        );
    });
}

/// The JSON transform on the same records, native and in Wasm, alternating
/// rounds; the median per record of each.
fn transform_cost() {
    const RECORDS: usize = 1000;
    const ROUNDS: usize = 15;
    let values: Vec<String> = (0..RECORDS).map(record).collect();
    let runtime = Runtime::new(Limits::default(), None).unwrap();
    let builtin = laurel::library::builtin("JsonTransform").unwrap();
    let function = runtime
        .load("JsonTransform", 1, builtin.bytes, Some(builtin.kind))
        .unwrap();
    let mut wasm = TransformInstance::new(function, FIELDS).unwrap();
    let native = json_transform::JsonTransform::from_config(FIELDS).unwrap();
    let raw: Vec<RawRecord<'_>> = values
        .iter()
        .enumerate()
        .map(|(n, value)| RawRecord {
            partition: 0,
            offset: n as i64,
            value: value.as_bytes(),
            key: None,
            timestamp_ms: None,
            headers: Vec::new(),
        })
        .collect();
    let kept: BTreeSet<String> = BTreeSet::from(["navi.trip_finished".to_string()]);
    let wanted = |t: &str| kept.contains(t);
    // All events made, then only the kept type's.
    let mut times: [Vec<Duration>; 4] = Default::default();
    for _ in 0..ROUNDS {
        for (k, typed) in [false, true].into_iter().enumerate() {
            let started = Instant::now();
            let mut builder = laurel_guest::RecordBatchBuilder::new(TOPIC);
            for (n, value) in values.iter().enumerate() {
                builder.push(0, n as i64, value.as_bytes(), None, None, &[]);
            }
            let batch = builder.finish();
            for record in laurel_guest::records(&batch) {
                if typed {
                    black_box(native.transform_wanted(&record, &wanted).unwrap());
                } else {
                    black_box(native.transform(&record).unwrap());
                }
            }
            times[2 * k].push(started.elapsed());
            let started = Instant::now();
            black_box(
                wasm.apply_for_types(TOPIC, &raw, typed.then_some(&kept))
                    .unwrap(),
            );
            times[2 * k + 1].push(started.elapsed());
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2].as_nanos() as f64 / RECORDS as f64
    };
    let [native, wasm, native_typed, wasm_typed] = times.each_mut().map(median);
    println!(
        "JsonTransform per record, every event made: native {native:.0} ns, Wasm {wasm:.0} ns (batches of {RECORDS}): Wasm/native {:.2}",
        wasm / native
    );
    println!(
        "JsonTransform per record, only the kept type made (0.6%): native {native_typed:.0} ns, Wasm {wasm_typed:.0} ns: Wasm/native {:.2}",
        wasm_typed / native_typed
    );
    row(
        "prefilter",
        "JsonTransform per record, told the kept type, in Wasm (baseline: the same crate native)",
        &format!("{wasm_typed:.0} ns"),
        &format!("{native_typed:.0} ns"),
        &format!("{:.2}x", wasm_typed / native_typed),
        "",
    );
}

/// Consumes `count` records of the raw topic and drops them; prints the
/// rate from the first record to the last.
fn bare(brokers: &str, count: usize) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", brokers)
            .set("group.id", "bench.bare")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            // Fetched as Laurel's consumers fetch: with librdkafka's default
            // backoff (1 s once 100,000 records wait unread), a bare
            // consumer of more than about 700,000 records sat idle and
            // measured a third of its rate.
            .set("fetch.wait.max.ms", "20")
            .set("fetch.queue.backoff.ms", "10");
        // `LAUREL_BENCH_BARE_SET="key=value;..."`: settings of the
        // pre-filter's consumer tried on the bare one, to find what costs.
        for setting in std::env::var("LAUREL_BENCH_BARE_SET")
            .unwrap_or_default()
            .split(';')
            .filter(|s| !s.is_empty())
        {
            let (key, value) = setting.split_once('=').expect("key=value");
            config.set(key, value);
        }
        if std::env::var_os("LAUREL_BENCH_BARE_BATCH").is_some() {
            return bare_batch(config, count);
        }
        let detach = std::env::var_os("LAUREL_BENCH_BARE_DETACH").is_some();
        // One stream for every record, as the pre-filter reads a batch
        // (`LAUREL_BENCH_BARE_RECV=1`: `recv`, which makes one per record).
        let per_record = std::env::var_os("LAUREL_BENCH_BARE_RECV").is_some();
        let consumer: StreamConsumer = config.create().unwrap();
        consumer.subscribe(&[TOPIC]).unwrap();
        let mut stream = consumer.stream();
        let mut seen = 0usize;
        let mut bytes = 0usize;
        let mut started = None;
        while seen < count {
            let message = if per_record {
                consumer.recv().await.unwrap()
            } else {
                stream.next().await.expect("endless").unwrap()
            };
            started.get_or_insert_with(Instant::now);
            if detach {
                bytes += black_box(message.detach()).payload().map_or(0, <[u8]>::len);
            } else {
                bytes += message.payload().map_or(0, <[u8]>::len);
            }
            seen += 1;
        }
        let elapsed = started.unwrap().elapsed().as_secs_f64();
        black_box(bytes);
        println!("{}", (count - 1) as f64 / elapsed);
    });
}

/// Reads `count` records through librdkafka's batch call, 64 at a time,
/// as the pre-filter does, and drops them: what reading alone costs on
/// that path (rdkafka's API has no batch read). Its partitions are
/// assigned, not joined through the group: a batch call on the consumer's
/// queue must meet no rebalance (see the pre-filter's `fetch`).
fn bare_batch(config: ClientConfig, count: usize) {
    use rdkafka::bindings as rdsys;
    let consumer: BaseConsumer = config.create().unwrap();
    let mut assignment = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        assignment
            .add_partition_offset(TOPIC, partition, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&assignment).unwrap();
    // SAFETY: the queue and every message are destroyed before the
    // consumer; `messages` has room for what is asked.
    let (mut seen, mut bytes, mut started) = (0usize, 0usize, None);
    unsafe {
        let queue = rdsys::rd_kafka_queue_get_consumer(consumer.client().native_ptr());
        let mut messages = [std::ptr::null_mut::<rdsys::rd_kafka_message_t>(); 64];
        while seen < count {
            let n = rdsys::rd_kafka_consume_batch_queue(queue, 100, messages.as_mut_ptr(), 64);
            for &message in &messages[..usize::try_from(n).unwrap_or(0)] {
                if (*message).err == rdsys::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
                    started.get_or_insert_with(Instant::now);
                    bytes += (*message).len;
                    seen += 1;
                }
                rdsys::rd_kafka_message_destroy(message);
            }
        }
        rdsys::rd_kafka_queue_destroy(queue);
    }
    let elapsed = started.unwrap().elapsed().as_secs_f64();
    black_box(bytes);
    println!("{}", (count - 1) as f64 / elapsed);
}

/// A child process stopped (SIGTERM, then waited for) when dropped, also
/// when a measurement panics: a pre-filter left running on the pinned core
/// would skew every later run.
struct Stopped(Child);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

fn pinned(cpu: usize, program: &str) -> Command {
    let mut command = Command::new("taskset");
    command.args(["-c", &cpu.to_string(), program]);
    command
}

async fn measure(server: &str, count: usize, cpu: usize) -> (f64, f64) {
    let url = format!("{server}/laurel_bench_prefilter");
    let (admin, connection) =
        tokio_postgres::connect(&format!("{server}/postgres"), tokio_postgres::NoTls)
            .await
            .unwrap();
    tokio::spawn(connection);
    admin
        .batch_execute("DROP DATABASE IF EXISTS laurel_bench_prefilter WITH (FORCE)")
        .await
        .unwrap();
    admin
        .batch_execute("CREATE DATABASE laurel_bench_prefilter")
        .await
        .unwrap();
    let mut store = Store::connect(&url).await.unwrap();
    store.migrate().await.unwrap();
    let runtime = Runtime::new(Limits::default(), None).unwrap();
    laurel::library::register(&mut store, &runtime)
        .await
        .unwrap();
    let registry = Registry::start(&url, runtime).await.unwrap();
    laurel::definitions::apply(&mut store, &registry, AWARD)
        .await
        .unwrap();
    let pipeline = format!(
        r#"{{"name": "{PIPELINE}", "input_topic": "{TOPIC}", "source": "bss",
            "transform": {{"name": "JsonTransform", "config": {FIELDS}}}}}"#
    );
    laurel::pipelines::apply(&mut store, &registry, &pipeline)
        .await
        .unwrap();

    let broker = LocalBroker::start(None).await.unwrap();
    let brokers = broker.bootstrap_servers().to_string();
    broker.create_topic(TOPIC, PARTITIONS).unwrap();
    broker.create_topic("events.bss", 4).unwrap();
    broker.create_topic(&format!("{TOPIC}.dead"), 1).unwrap();
    let producer = kafka::producer(&brokers).unwrap();
    let values: Vec<String> = (0..count).map(record).collect();
    for (c, chunk) in values.chunks(5000).enumerate() {
        let sends = chunk.iter().enumerate().map(|(i, value)| {
            let key = format!("k-{}", c * 5000 + i);
            let producer = &producer;
            async move {
                kafka::publish(producer, TOPIC, Some(key.as_bytes()), value.as_bytes(), &[]).await
            }
        });
        for result in futures_util::future::join_all(sends).await {
            result.unwrap();
        }
    }

    // Bare: this binary, pinned; rdkafka's consumer, then librdkafka's
    // batch call.
    let bare = |batch: bool| {
        let me = std::env::current_exe().unwrap();
        let mut command = pinned(cpu, me.to_str().unwrap());
        command
            .env("LAUREL_BENCH_BARE_BROKERS", &brokers)
            .env("LAUREL_BENCH_RECORDS", count.to_string());
        if batch {
            command.env("LAUREL_BENCH_BARE_BATCH", "1");
        }
        let output = command.stderr(Stdio::inherit()).output().unwrap();
        assert!(output.status.success(), "the bare consumer failed");
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse::<f64>()
            .unwrap()
    };
    let (bare, bare_batch) = (bare(false), bare(true));

    // Laurel's pre-filter, pinned the same way.
    let cache = std::env::temp_dir().join("laurel-bench-prefilter-cache");
    let child: Child = pinned(cpu, env!("CARGO_BIN_EXE_laurel"))
        .args(["serve", "--roles", "prefilter"])
        .env("LAUREL_DATABASE_URL", &url)
        .env("LAUREL_KAFKA_BROKERS", &brokers)
        .env("LAUREL_CACHE_DIR", &cache)
        // LAUREL_BENCH_LOG (e.g. `laurel::prefilter=debug`) shows
        // each batch's time per phase.
        .env(
            "LAUREL_LOG",
            std::env::var("LAUREL_BENCH_LOG").unwrap_or_else(|_| "warn".into()),
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let child = Stopped(child);
    let laurel = committed_rate(&brokers, count).await;
    drop(child);
    let kept = high_watermarks(&brokers, "events.bss", 4);
    assert_eq!(
        kept,
        trips(count) as i64,
        "the pre-filter kept {kept} events, not the {} trips",
        trips(count)
    );
    println!("  kept: {kept} of {count} records (the trips), on events.bss");
    println!(
        "  for reference, librdkafka's batch call alone: {bare_batch:>8.0} records/s (the pre-filter at {:.2} of it; the goal is against rdkafka's consumer)",
        laurel / bare_batch
    );
    (bare, laurel)
}

/// Polls the pipeline's committed offsets until they cover `count`
/// records; the rate from the first progress seen to the end.
async fn committed_rate(brokers: &str, count: usize) -> f64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", format!("laurel.prefilter.{PIPELINE}"))
        .create()
        .unwrap();
    let mut partitions = TopicPartitionList::new();
    for partition in 0..PARTITIONS {
        partitions.add_partition(TOPIC, partition);
    }
    let deadline = Instant::now() + Duration::from_secs(600);
    let mut first: Option<(Instant, i64)> = None;
    loop {
        let committed = consumer
            .committed_offsets(partitions.clone(), Duration::from_secs(5))
            .map(|offsets| {
                offsets
                    .elements()
                    .iter()
                    .map(|e| match e.offset() {
                        Offset::Offset(o) => o,
                        _ => 0,
                    })
                    .sum::<i64>()
            })
            .unwrap_or(0);
        let now = Instant::now();
        if committed > 0 && first.is_none() {
            first = Some((now, committed));
        }
        if committed as usize >= count {
            let (at, from) = first.expect("progress was seen");
            let elapsed = now.duration_since(at).as_secs_f64();
            assert!(
                elapsed > 0.5,
                "too few records to time: raise LAUREL_BENCH_RECORDS"
            );
            return (committed - from) as f64 / elapsed;
        }
        assert!(
            now < deadline,
            "the pre-filter did not finish in 10 minutes"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn high_watermarks(brokers: &str, topic: &str, partitions: i32) -> i64 {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .unwrap();
    (0..partitions)
        .map(|p| {
            consumer
                .fetch_watermarks(topic, p, Duration::from_secs(5))
                .unwrap()
                .1
        })
        .sum()
}
