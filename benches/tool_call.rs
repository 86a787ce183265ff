//! `workspace:read_file` on a small file: the full Trellis path (grant ->
//! fresh instance -> schema check -> call -> JSON result) under the grant of a turn whose
//! folder an earlier call opened, and as the first call of a turn (a new grant), against
//! bare wasmtime doing the same call on the same component (InstancePre + pooling,
//! no Trellis code), measured side by side in one run. The bare baseline runs
//! twice: with wasmtime's default pool, and with the pool settings Trellis' engine
//! adds where the kernel has `PAGEMAP_SCAN` (pages a call wrote are reset in place
//! and stay mapped for the next instance).
//!
//! Besides criterion's report, prints p50/p99 of each from an interleaved
//! sample and their ratios, then the p50 of each phase of a bare call (WASI
//! context and store, instantiation, the call, dropping the store) for
//! `read_file` and for the `echo` tool of a small test component: the floor of a
//! fresh instance per call. `BENCHMARKS.md` records these figures.

use std::path::Path;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group};
use serde_json::json;
use trellis_sandbox::{CacheSetting, Engine, Grant, Limits, PluginRegistry};
use wasmtime::component::{Component, InstancePre, Linker, Val};
use wasmtime::{Config, InstanceAllocationStrategy, PoolingAllocationConfig, Store};
use wasmtime_wasi::{FsPerms, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

const ARGS: &str = r#"{"path":"notes/a.md"}"#;

struct Trellis {
    registry: PluginRegistry,
    grant: Grant,
    limits: Limits,
}

impl Trellis {
    /// A call under the turn's grant, whose folder an earlier call of the turn opened.
    async fn call(&self) -> serde_json::Value {
        self.call_under(&self.grant).await
    }

    /// The first call of a turn: a grant made for it, its folder opened and checked.
    async fn first_call(&self, notes: &Path) -> serde_json::Value {
        let grant = Grant::none().read(notes, "/notes").unwrap();
        self.call_under(&grant).await
    }

    async fn call_under(&self, grant: &Grant) -> serde_json::Value {
        let args: serde_json::Value = serde_json::from_str(ARGS).unwrap();
        self.registry
            .call_tool("workspace:read_file", &args, grant, &self.limits)
            .await
            .unwrap()
    }
}

struct BareState {
    wasi: WasiCtx,
    table: wasmtime::component::ResourceTable,
}

impl WasiView for BareState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

struct Bare {
    engine: wasmtime::Engine,
    pre: InstancePre<BareState>,
    notes: std::path::PathBuf,
}

/// The pooling allocator of the bare baseline.
#[derive(Clone, Copy, PartialEq)]
enum Pool {
    /// wasmtime's defaults.
    Default,
    /// What Trellis' engine sets on top where the kernel has `PAGEMAP_SCAN`: the pages a
    /// call wrote are reset in place and stay mapped for the next instance in the slot.
    KeepResident,
}

impl Bare {
    fn new(component: &[u8], notes: &Path, pool: Pool) -> Bare {
        let mut config = Config::new();
        let mut pooling = PoolingAllocationConfig::default();
        if pool == Pool::KeepResident && PoolingAllocationConfig::is_pagemap_scan_available() {
            pooling
                .pagemap_scan(wasmtime::Enabled::Yes)
                .linear_memory_keep_resident(trellis_sandbox::engine::KEEP_RESIDENT_BYTES)
                .table_keep_resident(trellis_sandbox::engine::KEEP_RESIDENT_BYTES);
        }
        config.allocation_strategy(InstanceAllocationStrategy::Pooling(pooling));
        let engine = wasmtime::Engine::new(&config).unwrap();
        let component = Component::new(&engine, component).unwrap();
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        // The Trellis host interfaces are imported but never called by read_file:
        // stub them so the component links, with no Trellis code involved.
        for (name, item) in component.component_type().imports(&engine) {
            let wasmtime::component::types::ComponentItem::ComponentInstance(instance) = item.ty
            else {
                continue;
            };
            if !name.starts_with("trellis:") {
                continue;
            }
            let mut stub = linker.instance(name).unwrap();
            for (func, _) in instance.exports(&engine) {
                stub.func_new(func, |_, _, _, _| {
                    Err(wasmtime::Error::msg("not used by the benchmark"))
                })
                .unwrap();
            }
        }
        let pre = linker.instantiate_pre(&component).unwrap();
        Bare {
            engine,
            pre,
            notes: notes.to_path_buf(),
        }
    }

    async fn call(&self) -> String {
        self.call_timed(&mut [Duration::ZERO; 4], "read_file", ARGS)
            .await
    }

    /// The call, adding the time of each phase to `phases`: WASI context and store,
    /// instantiation, the call, dropping the store.
    async fn call_timed(&self, phases: &mut [Duration; 4], tool: &str, args: &str) -> String {
        let start = Instant::now();
        let mut wasi = WasiCtxBuilder::new();
        // The same WASI setting as Trellis grants use, so only Trellis' own code differs.
        wasi.allow_blocking_current_thread(true);
        wasi.preopened_dir(&self.notes, "/notes", FsPerms::ReadOnly)
            .unwrap();
        let mut store = Store::new(
            &self.engine,
            BareState {
                wasi: wasi.build(),
                table: Default::default(),
            },
        );
        let built = Instant::now();
        phases[0] += built - start;
        let instance = self.pre.instantiate_async(&mut store).await.unwrap();
        let interface = instance
            .get_export_index(&mut store, None, "trellis:plugin/tool@0.1.0")
            .unwrap();
        let func = instance
            .get_export_index(&mut store, Some(&interface), "call-tool")
            .unwrap();
        let func = instance.get_func(&mut store, func).unwrap();
        let instantiated = Instant::now();
        phases[1] += instantiated - built;
        let mut results = [Val::Bool(false)];
        func.call_async(
            &mut store,
            &[Val::String(tool.into()), Val::String(args.into())],
            &mut results,
        )
        .await
        .unwrap();
        let called = Instant::now();
        phases[2] += called - instantiated;
        drop(store);
        phases[3] += called.elapsed();
        match &results[0] {
            Val::Result(Ok(Some(text))) => match &**text {
                Val::String(s) => s.clone(),
                other => panic!("unexpected {other:?}"),
            },
            other => panic!("unexpected {other:?}"),
        }
    }
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn tool_call(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let notes = dir.path().join("notes");
    std::fs::create_dir_all(&notes).unwrap();
    std::fs::write(
        notes.join("a.md"),
        "# A note\nSmall file read by the benchmark.\n",
    )
    .unwrap();

    let cache = std::env::temp_dir().join("trellis-bench-cache");
    let engine = Engine::new(CacheSetting::Dir(cache)).unwrap();
    let trellis = Trellis {
        registry: runtime
            .block_on(PluginRegistry::with_bundled(&engine))
            .unwrap(),
        grant: Grant::none().read(&notes, "/notes").unwrap(),
        limits: Limits::default(),
    };
    let workspace = trellis_sandbox::bundled::PLUGINS[0].component;
    let bare = Bare::new(workspace, &notes, Pool::Default);
    let resident = Bare::new(workspace, &notes, Pool::KeepResident);

    // Same answer from every path, or the comparison means nothing.
    let from_trellis = runtime.block_on(trellis.call());
    for baseline in [&bare, &resident] {
        let from_bare: serde_json::Value =
            serde_json::from_str(&runtime.block_on(baseline.call())).unwrap();
        assert_eq!(from_trellis, from_bare);
    }
    assert_eq!(from_trellis["total_lines"], json!(2));

    let mut group = c.benchmark_group("tool_call");
    group.bench_function("trellis", |b| b.iter(|| runtime.block_on(trellis.call())));
    group.bench_function("bare_wasmtime", |b| {
        b.iter(|| runtime.block_on(bare.call()))
    });
    group.bench_function("bare_wasmtime_keep_resident", |b| {
        b.iter(|| runtime.block_on(resident.call()))
    });
    group.finish();

    // Interleaved sample for percentiles: drift in machine load hits all alike.
    let samples = 5_000;
    let mut times = [(); 4].map(|()| Vec::with_capacity(samples));
    for round in 0..samples + 200 {
        for (i, time) in times.iter_mut().enumerate() {
            let start = Instant::now();
            match i {
                0 => drop(runtime.block_on(trellis.call())),
                1 => drop(runtime.block_on(bare.call())),
                2 => drop(runtime.block_on(resident.call())),
                _ => drop(runtime.block_on(trellis.first_call(&notes))),
            }
            // The first 200 rounds warm up.
            if round >= 200 {
                time.push(start.elapsed());
            }
        }
    }
    let [t, w, r, f] = times.map(|mut all| {
        all.sort();
        (
            micros(percentile(&all, 0.5)),
            micros(percentile(&all, 0.99)),
        )
    });
    println!();
    println!("tool_call, {samples} interleaved calls each:");
    for (name, (p50, p99)) in [
        ("trellis", t),
        ("trellis, new grant", f),
        ("bare wasmtime", w),
        ("bare, keep resident", r),
    ] {
        println!("  {name:<20} p50 {p50:>8.1} us   p99 {p99:>8.1} us");
    }
    println!(
        "  ratio to bare        p50 {:>8.2}      p99 {:>8.2}",
        t.0 / w.0,
        t.1 / w.1
    );
    println!(
        "  ratio to resident    p50 {:>8.2}      p99 {:>8.2}",
        t.0 / r.0,
        t.1 / r.1
    );
    println!(
        "  PAGEMAP_SCAN available: {}",
        PoolingAllocationConfig::is_pagemap_scan_available()
    );

    // Where a bare call's time goes, and the same for the smallest tool call there is (the
    // `echo` tool of a small test component): the floor of a fresh instance per call.
    let adversary = std::fs::read(trellis_test_programs::path("adversary")).unwrap();
    let echo = Bare::new(&adversary, &notes, Pool::Default);
    let echo_resident = Bare::new(&adversary, &notes, Pool::KeepResident);
    let echo_args = r#"{"value":"hi"}"#;
    assert_eq!(
        runtime.block_on(echo.call_timed(&mut [Duration::ZERO; 4], "echo", echo_args)),
        "\"hi\""
    );
    // Per phase, the median over the calls (a mean would be all preemption on a loaded machine).
    let mut phases = [(); 4].map(|()| Phases::default());
    for _ in 0..samples {
        phases[0].time(&runtime, &bare, "read_file", ARGS);
        phases[1].time(&runtime, &resident, "read_file", ARGS);
        phases[2].time(&runtime, &echo, "echo", echo_args);
        phases[3].time(&runtime, &echo_resident, "echo", echo_args);
    }
    println!("bare wasmtime, p50 of each phase over {samples} calls each:");
    let names = ["read_file", "read_file, resident", "echo", "echo, resident"];
    for (name, phases) in names.into_iter().zip(phases) {
        let [context, instantiate, call, drop] = phases.p50();
        println!(
            "  {name:<20} context+store {context:>6.1} us   instantiate {instantiate:>6.1} us   call {call:>6.1} us   drop {drop:>6.1} us"
        );
    }
}

/// The time of each phase of many bare calls.
#[derive(Default)]
struct Phases([Vec<Duration>; 4]);

impl Phases {
    fn time(&mut self, runtime: &tokio::runtime::Runtime, bare: &Bare, tool: &str, args: &str) {
        let mut one = [Duration::ZERO; 4];
        runtime.block_on(bare.call_timed(&mut one, tool, args));
        for (all, phase) in self.0.iter_mut().zip(one) {
            all.push(phase);
        }
    }

    fn p50(mut self) -> [f64; 4] {
        self.0.each_mut().map(|all| {
            all.sort();
            micros(percentile(all, 0.5))
        })
    }
}

criterion_group!(benches, tool_call);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
