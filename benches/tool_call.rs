//! `workspace:read_file` on a small file: the full Trellis path (grant -> fresh instance ->
//! schema check -> call -> JSON result) against bare wasmtime doing the same call on the same
//! component (an `InstancePre`, the call, no Trellis code), measured side by side in one run.
//!
//! Each Trellis row has a bare baseline that differs from it only by Trellis' own code: the
//! same pool configuration (the bare calls instantiate on the wasmtime engine of Trellis'
//! `Engine`, so the same pooling limits, and pages a call wrote reset in place and kept mapped
//! where the kernel has `PAGEMAP_SCAN`) and the same folder reuse:
//!
//! - **trellis, new grant** (the first call of a turn: the grant made, its folder opened and
//!   checked) against **bare, folder opened per call** (wasmtime-wasi opens the preopen by
//!   its path at every call). This is the like-for-like ratio printed first.
//! - **trellis, turn's grant** (a later call of a turn, preopening the folder the first call
//!   opened through `/proc/self/fd`) against **bare, folder opened once** (the folder opened
//!   once, preopened through `/proc/self/fd` at every call).
//!
//! For scale, the bare call also runs on a wasmtime engine with the default pool.
//!
//! Besides criterion's report, prints p50/p99 of each from an interleaved sample and their
//! ratios, then the p50 of each phase of a bare call (WASI context and store, instantiation,
//! the call, dropping the store) for `read_file` and for the `echo` tool of a small test
//! component: the floor of a fresh instance per call. `BENCHMARKS.md` records these figures.
//! Under `cargo test --benches` (quick mode) each sample is a few rounds: the equality checks
//! run, the figures mean nothing.

mod support;

use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
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

/// The pooling allocator of a bare baseline.
#[derive(Clone, Copy, PartialEq)]
enum Pool {
    /// A wasmtime engine with the default pool.
    Default,
    /// The wasmtime engine of Trellis' `Engine`: the pool configuration of Trellis' calls.
    Trellis,
}

/// How a bare call preopens the granted folder.
enum Folder {
    /// By its path at every call: wasmtime-wasi opens it (as a new grant's first call opens
    /// its folder).
    PerCall(PathBuf),
    /// Opened once; every call preopens that descriptor through `/proc/self/fd` (as the later
    /// calls of a turn preopen the folder its first call opened).
    Reused(std::fs::File),
}

impl Folder {
    fn reused(path: &Path) -> Folder {
        let dir = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(path)
            .unwrap();
        Folder::Reused(dir)
    }

    fn preopen_path(&self) -> PathBuf {
        match self {
            Folder::PerCall(path) => path.clone(),
            Folder::Reused(dir) => PathBuf::from(format!("/proc/self/fd/{}", dir.as_raw_fd())),
        }
    }
}

struct Bare {
    engine: wasmtime::Engine,
    pre: InstancePre<BareState>,
    folder: Folder,
}

impl Bare {
    fn new(trellis: &Engine, component: &[u8], folder: Folder, pool: Pool) -> Bare {
        let (engine, component) = match pool {
            Pool::Default => {
                let mut config = Config::new();
                config.allocation_strategy(InstanceAllocationStrategy::Pooling(
                    PoolingAllocationConfig::default(),
                ));
                let engine = wasmtime::Engine::new(&config).unwrap();
                let component = Component::new(&engine, component).unwrap();
                (engine, component)
            }
            // Loaded through Trellis' compile cache: compiling is not what is measured.
            Pool::Trellis => (
                trellis.wasmtime().clone(),
                trellis.load_component(component, "bench").unwrap(),
            ),
        };
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker).unwrap();
        // The Trellis host interfaces are imported but never called by these tools:
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
            folder,
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
        wasi.preopened_dir(self.folder.preopen_path(), "/notes", FsPerms::ReadOnly)
            .unwrap();
        let mut store = Store::new(
            &self.engine,
            BareState {
                wasi: wasi.build(),
                table: Default::default(),
            },
        );
        // Trellis' engine interrupts guests at their epoch deadline: one far away (a store's
        // default is now). An engine without epochs ignores it.
        store.set_epoch_deadline(Engine::ticks_for(Duration::from_secs(60)));
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

    let engine = Engine::new(CacheSetting::Dir(support::component_cache())).unwrap();
    let trellis = Trellis {
        registry: runtime
            .block_on(PluginRegistry::with_bundled(&engine))
            .unwrap(),
        grant: Grant::none().read(&notes, "/notes").unwrap(),
        limits: Limits::default(),
    };
    let workspace = trellis_sandbox::bundled::PLUGINS[0].component;
    let folder_per_call = || Folder::PerCall(notes.clone());
    let bare_per_call = Bare::new(&engine, workspace, folder_per_call(), Pool::Trellis);
    let bare_reused = Bare::new(&engine, workspace, Folder::reused(&notes), Pool::Trellis);
    let bare_default = Bare::new(&engine, workspace, folder_per_call(), Pool::Default);

    // Same answer from every path, or the comparison means nothing.
    let from_trellis = runtime.block_on(trellis.call());
    assert_eq!(runtime.block_on(trellis.first_call(&notes)), from_trellis);
    for baseline in [&bare_per_call, &bare_reused, &bare_default] {
        let from_bare: serde_json::Value =
            serde_json::from_str(&runtime.block_on(baseline.call())).unwrap();
        assert_eq!(from_bare, from_trellis);
    }
    assert_eq!(from_trellis["total_lines"], json!(2));

    let mut group = c.benchmark_group("tool_call");
    group.bench_function("trellis_new_grant", |b| {
        b.iter(|| runtime.block_on(trellis.first_call(&notes)))
    });
    group.bench_function("bare_folder_per_call", |b| {
        b.iter(|| runtime.block_on(bare_per_call.call()))
    });
    group.bench_function("trellis_turn_grant", |b| {
        b.iter(|| runtime.block_on(trellis.call()))
    });
    group.bench_function("bare_folder_reused", |b| {
        b.iter(|| runtime.block_on(bare_reused.call()))
    });
    group.bench_function("bare_default_pool", |b| {
        b.iter(|| runtime.block_on(bare_default.call()))
    });
    group.finish();

    // Interleaved sample for percentiles: drift in machine load hits all alike.
    let samples = support::rounds(5_000, 20);
    let warm_up = support::rounds(200, 2);
    let mut times = [(); 5].map(|()| Vec::with_capacity(samples));
    for round in 0..samples + warm_up {
        for (i, time) in times.iter_mut().enumerate() {
            let start = Instant::now();
            match i {
                0 => drop(runtime.block_on(trellis.first_call(&notes))),
                1 => drop(runtime.block_on(bare_per_call.call())),
                2 => drop(runtime.block_on(trellis.call())),
                3 => drop(runtime.block_on(bare_reused.call())),
                _ => drop(runtime.block_on(bare_default.call())),
            }
            if round >= warm_up {
                time.push(start.elapsed());
            }
        }
    }
    let [new_grant, per_call, turn_grant, reused, default] = times.map(|mut all| {
        all.sort();
        (
            micros(support::percentile(&all, 0.5)),
            micros(support::percentile(&all, 0.99)),
        )
    });
    println!();
    println!(
        "tool_call, {samples} interleaved calls each (bare calls on Trellis' engine unless said; PAGEMAP_SCAN available: {}):",
        PoolingAllocationConfig::is_pagemap_scan_available()
    );
    let ratio = |name: &str, (a50, a99): (f64, f64), (b50, b99): (f64, f64)| {
        println!(
            "  {name:<44} p50 {:>8.2}      p99 {:>8.2}",
            a50 / b50,
            a99 / b99
        );
    };
    // Like for like first: the same pool, the same folder reuse, only Trellis' code differs.
    ratio(
        "ratio new grant / bare, folder per call",
        new_grant,
        per_call,
    );
    ratio(
        "ratio turn's grant / bare, folder reused",
        turn_grant,
        reused,
    );
    for (name, (p50, p99)) in [
        ("trellis, new grant (first call of a turn)", new_grant),
        ("bare, folder opened per call", per_call),
        ("trellis, turn's grant (folder reused)", turn_grant),
        ("bare, folder opened once", reused),
        ("bare, default pool, folder per call", default),
    ] {
        println!("  {name:<44} p50 {p50:>8.1} us   p99 {p99:>8.1} us");
    }
    ratio(
        "ratio turn's grant / bare, default pool",
        turn_grant,
        default,
    );

    // Where a bare call's time goes, and the same for the smallest tool call there is (the
    // `echo` tool of a small test component): the floor of a fresh instance per call.
    let adversary = std::fs::read(trellis_test_programs::path("adversary")).unwrap();
    let echo = Bare::new(&engine, &adversary, folder_per_call(), Pool::Default);
    let echo_trellis = Bare::new(&engine, &adversary, folder_per_call(), Pool::Trellis);
    let echo_args = r#"{"value":"hi"}"#;
    for echo in [&echo, &echo_trellis] {
        assert_eq!(
            runtime.block_on(echo.call_timed(&mut [Duration::ZERO; 4], "echo", echo_args)),
            "\"hi\""
        );
    }
    // Per phase, the median over the calls (a mean would be all preemption on a loaded machine).
    let mut phases = [(); 4].map(|()| Phases::default());
    for _ in 0..samples {
        phases[0].time(&runtime, &bare_default, "read_file", ARGS);
        phases[1].time(&runtime, &bare_per_call, "read_file", ARGS);
        phases[2].time(&runtime, &echo, "echo", echo_args);
        phases[3].time(&runtime, &echo_trellis, "echo", echo_args);
    }
    println!("bare wasmtime, p50 of each phase over {samples} calls each:");
    let names = [
        "read_file, default pool",
        "read_file, Trellis' pool",
        "echo, default pool",
        "echo, Trellis' pool",
    ];
    for (name, phases) in names.into_iter().zip(phases) {
        let [context, instantiate, call, drop] = phases.p50();
        println!(
            "  {name:<24} context+store {context:>6.1} us   instantiate {instantiate:>6.1} us   call {call:>6.1} us   drop {drop:>6.1} us"
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
            micros(support::percentile(all, 0.5))
        })
    }
}

criterion_group!(benches, tool_call);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
}
