// The browser's WebGPU host loop: loads a Plan (see pkg/webgrad/backends/gpu_host.py) and replays
// it once per step. Python (webgrad/backends/webgpu_browser.py, in the Pyodide worker) calls it a
// few times per step; everything per command lives here because encoding 300 dispatches through
// the Python<->JS FFI costs ~2.5 ms where this loop costs ~0.14 ms.
//
//   const gpu = await requestDevice();        // adapter with its maximum limits -> Replay
//   const id = gpu.load(planJSON);            // buffers, pipelines (cached by WGSL text) and one
//   await gpu.ready(id);                      // bind group per dispatch; ready() rejects with the
//                                             // WGSL compile / validation errors
//   const bytes = await gpu.run(id, meta, blob, reads);   // ONE submit; ArrayBuffer of reads
//   const { timing, seconds } = await gpu.profile(id, meta, blob);  // one step, each kernel timed
//
// Errors thrown to Python carry `name`: "WGSLError" (shader compile or pipeline validation),
// "DeviceLostError" (device.lost resolved: nothing can run on this device any more),
// "GPUValidationError" / "GPUOutOfMemoryError" (anything else WebGPU refused), "PlanError".

const STAGING_POOL = 4;  // free staging buffers kept per read buffer; more are made on demand
// requested where the adapter has them: timestamps for profile(), subgroups for codegen's
// workgroup reductions (pkg/webgrad/codegen/wgsl.py, workgroup_reduce), shader-f16 for
// programs compiled with precision="mixed"/"f16" (docs/precision.md)
const WANTED_FEATURES = ["timestamp-query", "subgroups", "shader-f16"];

function named(name, message) {
  const error = new Error(message);
  error.name = name;
  return error;
}

/** The adapter's description, for messages ("google swiftshader (...)"). */
function describe(info) {
  if (!info) return "unknown WebGPU adapter";
  const parts = [info.vendor, info.architecture, info.device].filter(Boolean);
  const text = parts.join(" ") || "WebGPU adapter";
  return info.description ? `${text} (${info.description})` : text;
}

/** Every numeric limit of a GPUSupportedLimits, as a plain object. */
function plainLimits(limits) {
  const out = {};
  for (const key in limits) {  // WebIDL attributes are enumerable getters on the prototype
    if (typeof limits[key] === "number") out[key] = limits[key];
  }
  return out;
}

/** Request an adapter and a device with the adapter's maximum limits; returns a Replay. */
export async function requestDevice(options = {}) {
  const gpu = globalThis.navigator?.gpu;
  if (!gpu) {
    throw named("WebGPUUnavailable", "navigator.gpu is missing: this browser (or this context) " +
      "has no WebGPU. Use a Chromium-based browser (113+), Firefox 141+ or Safari 26+, served " +
      "over https or localhost.");
  }
  const adapter = await gpu.requestAdapter(options.powerPreference
    ? { powerPreference: options.powerPreference } : undefined);
  if (!adapter) {
    throw named("WebGPUUnavailable", "navigator.gpu.requestAdapter() found no GPU adapter " +
      "(WebGPU may be disabled or blocklisted here: see chrome://gpu)");
  }
  const requiredLimits = plainLimits(adapter.limits);
  // timestamps let profile() time each kernel on the GPU; they cost nothing when unused
  // (options.features: request these instead, e.g. [] for a device without timestamps)
  const requiredFeatures = (options.features ?? WANTED_FEATURES)
    .filter((f) => adapter.features.has(f));
  const device = await adapter.requestDevice({ requiredLimits, requiredFeatures,
                                               label: "webgrad" });
  const replay = new Replay(device, describe(adapter.info));
  // a software adapter (SwiftShader): backend='auto' prefers the CPU backend there
  // (pkg/webgrad/backends/__init__.py); browsers before GPUAdapterInfo.isFallbackAdapter
  // had it on the adapter, and some say nothing (the description's words then tell)
  replay.fallback = Boolean(adapter.info?.isFallbackAdapter ?? adapter.isFallbackAdapter);
  return replay;
}

// The worker's shared device: requested once, by whoever asks first. worker.mjs asks while
// Pyodide boots, so that the adapter and device round trips (and the pipelines it prewarms,
// Replay.prewarm) overlap the boot; webgpu_browser.request_device() then gets the same one.
let shared = null;   // Promise<Replay>
let current = null;  // the Replay it resolved to

/** The worker's shared Replay; a lost one (or a failed request) is replaced by a new one. */
export function sharedDevice() {
  if (shared) {
    return shared.then((replay) => (replay.lost ? renew() : replay), () => renew());
  }
  return renew();
}

function renew() {
  const before = current;
  const request = shared = requestDevice();
  request.then((replay) => {
    if (shared === request) current = replay;
    // a device made after a loss keeps the worker's listeners (the pipeline store and the
    // playground's compile count); registered first, this runs before any caller's then
    if (before) {
      replay.onUsed ??= before.onUsed;
      replay.onPipeline ??= before.onPipeline;
    }
  }, () => {});
  return request;
}

/** The shared Replay if one was made (null otherwise); requests nothing. */
export function currentDevice() {
  return current;
}

/** Format getCompilationInfo() errors with the source line they point at. */
function compileErrors(info, wgsl) {
  const lines = wgsl.split("\n");
  return info.messages.filter((m) => m.type === "error").map((m) => {
    const src = lines[m.lineNum - 1];
    const where = m.lineNum ? `${m.lineNum}:${m.linePos}: ` : "";
    const pad = " ".repeat(Math.max(0, m.linePos - 1));
    const caret = src === undefined ? "" : `\n    ${src}\n    ${pad}^`;
    return `${where}error: ${m.message}${caret}`;
  }).join("\n");
}

export class Replay {
  constructor(device, info) {
    this.device = device;
    this.queue = device.queue;
    this.info = info;
    this.fallback = false;   // the adapter is a software fallback (requestDevice sets it)
    this.limits = plainLimits(device.limits);
    this.features = [...device.features].sort();
    // WGSL language features (dot4I8Packed: packed_4x8_integer_dot_product), for codegen
    this.wgslFeatures = [...(globalThis.navigator?.gpu?.wgslLanguageFeatures ?? [])].sort();
    this.lost = null;        // {reason, message} once device.lost resolved
    this.uncaptured = [];    // recent errors no scope caught, quoted in later messages
    this.modules = new Map();   // WGSL text -> {pipeline, check: Promise<string|null>}
    this.used = [];             // WGSL texts of the loaded plans, in order of first use
    this.usedSet = new Set();   // (worker.mjs keeps them, to prewarm them on the next visit)
    this.onUsed = null;         // called after a load() that used WGSL texts new to `used`
    this.onPipeline = null;     // called with the entry of every pipeline() asked for (made
                                // or not): worker.mjs reports a compile's progress from it
    this.programs = new Map();
    this.persistent = new Map();  // scope + key -> {buffer, refs}
    this.nextId = 1;
    // Counters for profiling: runs, submits, milliseconds spent encoding (the JS loop alone);
    // pipelines compiled for load() and for prewarm() (tests of the prewarm read them).
    this.stats = { runs: 0, submits: 0, dispatches: 0, encodeMs: 0, compiled: 0, prewarmed: 0 };
    device.lost.then((info) => {
      this.lost = { reason: String(info.reason), message: String(info.message || "") };
    });
    device.addEventListener("uncapturederror", (event) => {
      if (this.uncaptured.push(String(event.error?.message ?? event.error)) > 8) {
        this.uncaptured.shift();
      }
    });
  }

  lostError() {
    const { reason, message } = this.lost;
    return named("DeviceLostError", `the WebGPU device was lost (reason: ${reason}` +
      `${message ? `: ${message}` : ""}); its buffers and programs are gone`);
  }

  program(id) {
    if (this.lost) throw this.lostError();
    const program = this.programs.get(id);
    if (!program) throw named("PlanError", `no loaded program ${id} (unloaded, or never loaded)`);
    return program;
  }

  /** A compute pipeline for this WGSL text, compiled once per device: createComputePipelineAsync,
   *  so that a plan's pipelines compile together (on the browser's threads, while Python goes
   *  on) rather than one by one. {pipeline: set once made, check: Promise<error text|null>}. */
  pipeline(wgsl, label, counter = "compiled") {
    let entry = this.modules.get(wgsl);
    if (entry) {
      this.onPipeline?.(entry);
      return entry;
    }
    const device = this.device;
    this.stats[counter]++;
    device.pushErrorScope("validation");
    const module = device.createShaderModule({ code: wgsl, label });
    const scope = device.popErrorScope();
    entry = { pipeline: null, check: null };
    const made = device.createComputePipelineAsync({
      layout: "auto", compute: { module, entryPoint: "main" }, label })
      .then((pipeline) => { entry.pipeline = pipeline; return null; }, (e) => e);
    entry.check = Promise.all([module.getCompilationInfo(), scope, made])
      .then(([info, validation, failed]) => {
        const errors = compileErrors(info, wgsl);
        if (errors) return errors;
        if (validation) return validation.message;
        return failed ? String(failed.message ?? failed) : null;
      });
    this.modules.set(wgsl, entry);
    this.onPipeline?.(entry);
    return entry;
  }

  /** Start compiling pipelines that plans are expected to need (the WGSL texts a previous
   *  session used, worker.mjs): they compile in the GPU process (createComputePipelineAsync,
   *  see pipeline()) while the worker does other things, and a later load() of a plan with
   *  the same WGSL waits for them instead of compiling them again. A text that does not
   *  compile costs nothing more: a load() that uses it reports why. Returns how many started. */
  prewarm(texts) {
    let n = 0;
    for (const wgsl of texts) {
      if (typeof wgsl !== "string" || this.modules.has(wgsl)) continue;
      this.pipeline(wgsl, `prewarmed ${n++}`, "prewarmed");
    }
    return n;
  }

  /** Create a plan's buffers, pipelines and bind groups; returns the program id at once.
   *  Errors (WGSL, validation, out of memory) surface through ready(id).
   *  `scope` namespaces the plan's persistent buffers: plans loaded with the same scope (one
   *  Python host) share a buffer per "persistent" key, refcounted by the programs naming it. */
  load(planJSON, scope = "") {
    if (this.lost) throw this.lostError();
    const plan = typeof planJSON === "string" ? JSON.parse(planJSON) : planJSON;
    const device = this.device;
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST |
      GPUBufferUsage.UNIFORM;
    const maxWorkgroups = this.limits.maxComputeWorkgroupsPerDimension;
    // Check the persistent buffers against those already there before creating anything.
    // Like NativeHost: at least 16 bytes (a vec4), a multiple of 4, so every buffer can be bound.
    const sizeOf = (b) => Math.max(16, Math.ceil(b.size / 4) * 4);
    const keyOf = (b) => `${scope}\u0000${b.persistent}`;
    plan.buffers.forEach((b, i) => {
      const shared = b.persistent != null && this.persistent.get(keyOf(b));
      if (shared && shared.buffer.size !== sizeOf(b)) {
        throw named("PlanError", `buffer ${i} (${b.label || "unlabeled"}): persistent buffer ` +
          `${JSON.stringify(b.persistent)} is ${shared.buffer.size} bytes in the programs ` +
          `loaded before, ${b.size} in this plan`);
      }
    });
    const id = this.nextId++;
    device.pushErrorScope("out-of-memory");
    device.pushErrorScope("validation");
    const owned = [], sharedKeys = [];
    const buffers = plan.buffers.map((b, i) => {
      if (b.persistent == null) {
        const buffer = device.createBuffer({
          size: sizeOf(b), usage, label: b.label || `buffer ${i}` });
        owned.push(buffer);
        return buffer;
      }
      const key = keyOf(b);
      let shared = this.persistent.get(key);
      if (!shared) {
        shared = { refs: 0, buffer: device.createBuffer({  // zero-filled, as WebGPU promises
          size: sizeOf(b), usage, label: b.label || String(b.persistent) }) };
        this.persistent.set(key, shared);
      }
      shared.refs++;
      sharedKeys.push(key);
      return shared.buffer;
    });
    const pipelines = plan.pipelines.map((p, k) =>
      this.pipeline(p.wgsl, p.label || `pipeline ${k}`));
    const before = this.used.length;
    for (const p of plan.pipelines) {
      if (!this.usedSet.has(p.wgsl)) { this.usedSet.add(p.wgsl); this.used.push(p.wgsl); }
    }
    if (this.used.length > before && this.onUsed) this.onUsed();
    const bufferOf = (ref, where) => {
      const index = typeof ref === "number" ? ref : ref.buffer;
      if (!(index >= 0 && index < buffers.length)) {
        throw named("PlanError", `${where}: buffer ${index} does not exist ` +
          `(the plan has ${buffers.length})`);
      }
      return buffers[index];
    };

    // Consecutive dispatches share one compute pass; a copy ends the pass. The commands are
    // checked here (a PlanError is thrown at once); a dispatch's bind group needs its
    // pipeline's layout, so the bind groups are made in `ready`, once the pipelines compiled.
    const segments = [];
    const dispatches = [];  // {d: the segment's entry, entry, entries, label}
    let pass = null;
    try {
      plan.commands.forEach((c, i) => {
        if (c.op === "dispatch") {
          const entry = pipelines[c.pipeline];
          if (!entry) {
            throw named("PlanError", `command ${i}: pipeline ${c.pipeline} does not exist`);
          }
          const [x, y = 1, z = 1] = c.workgroups;
          if (Math.max(x, y, z) > maxWorkgroups) {
            throw named("PlanError", `command ${i} (${plan.pipelines[c.pipeline].label ||
              `pipeline ${c.pipeline}`}): workgroups [${x}, ${y}, ${z}] exceed this device's ` +
              `maxComputeWorkgroupsPerDimension ${maxWorkgroups}`);
          }
          const entries = c.bindings.map((ref, k) => ({
            binding: k,
            resource: typeof ref === "number" ? { buffer: bufferOf(ref, `command ${i}`) }
              : { buffer: bufferOf(ref, `command ${i}`), offset: ref.offset ?? 0,
                  size: ref.size },
          }));
          if (!pass) segments.push(pass = { dispatches: [] });
          const d = { pipeline: null, bindGroup: null, x, y, z };
          pass.dispatches.push(d);
          dispatches.push({ d, entry, entries, label: `command ${i}` });
        } else if (c.op === "copy") {
          pass = null;
          segments.push({
            src: bufferOf(c.src, `command ${i}`), dst: bufferOf(c.dst, `command ${i}`),
            srcOffset: c.src_offset ?? 0, dstOffset: c.dst_offset ?? 0, size: c.size });
        } else {
          throw named("PlanError", `command ${i}: unknown op ${JSON.stringify(c.op)} ` +
            "(expected 'dispatch' or 'copy')");
        }
      });
    } catch (e) {
      device.popErrorScope();
      device.popErrorScope();
      this.release(owned, sharedKeys);
      throw e;
    }
    const validation = device.popErrorScope();
    const memory = device.popErrorScope();
    // Reads return the plan's sizes (the buffers themselves may be a little larger).
    const sizes = plan.buffers.map((b) => Math.ceil(b.size / 4) * 4);
    const program = { buffers, sizes, owned, sharedKeys, segments, staging: new Map(),
                      ready: null, loaded: false };
    program.ready = (async () => {
      const checks = await Promise.all(pipelines.map((p) => p.check));
      const bad = checks.findIndex((c) => c !== null);
      if (bad >= 0) {
        const label = plan.pipelines[bad].label || `pipeline ${bad}`;
        throw named("WGSLError", `WGSL of ${label} does not compile:\n${checks[bad]}`);
      }
      if (program.unloaded) return;
      device.pushErrorScope("out-of-memory");
      device.pushErrorScope("validation");
      for (const { d, entry, entries, label } of dispatches) {
        d.pipeline = entry.pipeline;
        d.bindGroup = device.createBindGroup({
          layout: entry.pipeline.getBindGroupLayout(0), entries, label });
      }
      const groups = device.popErrorScope();
      const groupsMemory = device.popErrorScope();
      const [v, m, gv, gm] = await Promise.all([validation, memory, groups, groupsMemory]);
      if (m || gm) throw named("GPUOutOfMemoryError", `loading the plan: ${(m || gm).message}`);
      if (v || gv) throw named("GPUValidationError", `loading the plan: ${(v || gv).message}`);
    })();
    program.ready.then(() => { program.loaded = true; }, () => {});
    this.programs.set(id, program);
    return id;
  }

  /** Resolves once program `id` compiled and validated; rejects with the reason otherwise. */
  ready(id) {
    return this.program(id).ready;
  }

  /** queue.writeBuffer: lands before the next submit. */
  write(id, buffer, data, offset = 0) {
    const program = this.program(id);
    this.queue.writeBuffer(program.buffers[buffer], offset, data);
  }

  takeStaging(program, buffer) {
    const free = program.staging.get(buffer);
    if (free && free.length) return free.pop();
    return this.device.createBuffer({
      size: program.buffers[buffer].size,
      usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST,
      label: `staging ${program.buffers[buffer].label}`,
    });
  }

  giveStaging(program, buffer, staging) {
    let free = program.staging.get(buffer);
    if (!free) program.staging.set(buffer, free = []);
    if (!program.unloaded && free.length < STAGING_POOL) {
      free.push(staging);
    } else {
      staging.destroy();
    }
  }

  /** One step: writes, every command in ONE submission, then the reads.
   *  meta: [buffer, offset, size, bufferOffset]* into blob (a Uint8Array) for each write;
   *  reads: buffer ids. Resolves to one ArrayBuffer holding the reads back to back, or null. */
  async run(id, meta, blob, reads, commands = true) {
    const program = this.program(id);
    if (!program.loaded) await program.ready;
    const { device, queue } = this;
    for (let i = 0; i < meta.length; i += 4) {
      queue.writeBuffer(program.buffers[meta[i]], meta[i + 3], blob, meta[i + 1], meta[i + 2]);
    }
    const t0 = performance.now();
    device.pushErrorScope("validation");
    const encoder = device.createCommandEncoder();
    if (commands) {
      this.stats.runs++;
      for (const seg of program.segments) {
        if (seg.dispatches) {
          const pass = encoder.beginComputePass();
          let last = null;
          for (const d of seg.dispatches) {
            if (d.pipeline !== last) pass.setPipeline(last = d.pipeline);
            pass.setBindGroup(0, d.bindGroup);
            pass.dispatchWorkgroups(d.x, d.y, d.z);
          }
          pass.end();
          this.stats.dispatches += seg.dispatches.length;
        } else {
          encoder.copyBufferToBuffer(seg.src, seg.srcOffset, seg.dst, seg.dstOffset, seg.size);
        }
      }
    }
    const staging = [];
    for (const b of reads) {
      const s = this.takeStaging(program, b);
      if (program.sizes[b]) {
        encoder.copyBufferToBuffer(program.buffers[b], 0, s, 0, program.sizes[b]);
      }
      staging.push(s);
    }
    queue.submit([encoder.finish()]);
    this.stats.submits++;
    const scope = device.popErrorScope();
    this.stats.encodeMs += performance.now() - t0;
    try {
      const maps = staging.map((s) => s.mapAsync(GPUMapMode.READ));
      const [error] = await Promise.all([scope, ...maps]);
      if (error) {
        throw named("GPUValidationError", `running program ${id}: ${error.message}`);
      }
      if (!staging.length) return null;
      if (staging.length === 1) {
        const data = staging[0].getMappedRange().slice(0, program.sizes[reads[0]]);
        staging[0].unmap();
        this.giveStaging(program, reads[0], staging[0]);
        return data;
      }
      let total = 0;
      for (const b of reads) total += program.sizes[b];
      const out = new Uint8Array(total);
      let at = 0;
      staging.forEach((s, k) => {
        const size = program.sizes[reads[k]];
        out.set(new Uint8Array(s.getMappedRange(), 0, size), at);
        at += size;
        s.unmap();
        this.giveStaging(program, reads[k], s);
      });
      return out.buffer;
    } catch (e) {
      for (const s of staging) s.destroy();
      // device.lost resolves a moment after the failure that it causes: wait for it briefly so
      // that a lost device is reported as such, not as the failed mapAsync it led to.
      if (!this.lost) await Promise.race([this.device.lost, new Promise((r) => setTimeout(r, 50))]);
      if (this.lost) throw this.lostError();
      throw e;
    }
  }

  /** One step with every dispatch timed (profile.py's host side; NativeHost.profile is the
   *  same for wgpu-py): the writes, then each dispatch in a compute pass of its own. With
   *  'timestamp-query', GPU timestamps at each pass's start and end, all in ONE submission
   *  (timing "timestamp"; a browser may quantise them, Chrome to 100 us without
   *  --enable-webgpu-developer-features, so a short kernel may read 0 while sums stay right
   *  on average; headless Chromium's SwiftShader gave unquantised times). Without it, each
   *  command is submitted alone and waited for
   *  (onSubmittedWorkDone), "wall" time including a submission's latency. Resolves to
   *  {timing, seconds}: seconds per plan command in order, null for copies. */
  async profile(id, meta, blob) {
    const program = this.program(id);
    if (!program.loaded) await program.ready;
    const { device, queue } = this;
    for (let i = 0; i < meta.length; i += 4) {
      queue.writeBuffer(program.buffers[meta[i]], meta[i + 3], blob, meta[i + 1], meta[i + 2]);
    }
    // the plan's commands in order: {d} a dispatch, {copy} a copy
    const commands = program.segments.flatMap((seg) => seg.dispatches
      ? seg.dispatches.map((d) => ({ d })) : [{ copy: seg }]);
    const encodeOne = (encoder, c, timestampWrites) => {
      if (c.d) {
        const pass = encoder.beginComputePass(timestampWrites ? { timestampWrites } : undefined);
        pass.setPipeline(c.d.pipeline);
        pass.setBindGroup(0, c.d.bindGroup);
        pass.dispatchWorkgroups(c.d.x, c.d.y, c.d.z);
        pass.end();
      } else {
        const s = c.copy;
        encoder.copyBufferToBuffer(s.src, s.srcOffset, s.dst, s.dstOffset, s.size);
      }
    };
    device.pushErrorScope("validation");
    let popped = false;
    const check = async () => {
      popped = true;
      const error = await device.popErrorScope();
      if (error) throw named("GPUValidationError", `profiling program ${id}: ${error.message}`);
    };
    try {
      if (!device.features.has("timestamp-query")) {
        const seconds = [];
        for (const c of commands) {
          const encoder = device.createCommandEncoder();
          encodeOne(encoder, c, null);
          const t0 = performance.now();
          queue.submit([encoder.finish()]);
          await queue.onSubmittedWorkDone();
          seconds.push((performance.now() - t0) / 1e3);
        }
        await check();
        return { timing: "wall", seconds };
      }
      const nd = commands.filter((c) => c.d).length;
      const querySet = device.createQuerySet({ type: "timestamp", count: 2 * Math.max(nd, 1) });
      const bytes = 16 * Math.max(nd, 1);
      const resolved = device.createBuffer({
        size: bytes, usage: GPUBufferUsage.QUERY_RESOLVE | GPUBufferUsage.COPY_SRC });
      const staging = device.createBuffer({
        size: bytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      try {
        const encoder = device.createCommandEncoder();
        let k = 0;
        for (const c of commands) {
          encodeOne(encoder, c, c.d ? { querySet, beginningOfPassWriteIndex: 2 * k,
                                         endOfPassWriteIndex: 2 * k + 1 } : null);
          if (c.d) k++;
        }
        if (nd) {
          encoder.resolveQuerySet(querySet, 0, 2 * nd, resolved, 0);
          encoder.copyBufferToBuffer(resolved, 0, staging, 0, bytes);
        }
        queue.submit([encoder.finish()]);
        await staging.mapAsync(GPUMapMode.READ);
        const ticks = new BigUint64Array(staging.getMappedRange().slice(0));  // nanoseconds
        staging.unmap();
        await check();
        k = 0;
        const seconds = commands.map((c) => {
          if (!c.d) return null;
          const [t0, t1] = [ticks[2 * k], ticks[2 * k + 1]];
          k++;
          return t1 > t0 ? Number(t1 - t0) / 1e9 : 0;
        });
        return { timing: "timestamp", seconds };
      } finally {
        querySet.destroy();
        resolved.destroy();
        staging.destroy();
      }
    } catch (e) {
      if (!popped) device.popErrorScope().catch(() => {});
      if (!this.lost) await Promise.race([this.device.lost, new Promise((r) => setTimeout(r, 50))]);
      if (this.lost) throw this.lostError();
      throw e;
    }
  }

  /** The bytes of one buffer (after everything submitted so far). */
  read(id, buffer) {
    return this.run(id, [], null, [buffer], false);
  }

  /** Free a program's buffers; its cached pipelines stay for plans with the same WGSL. */
  unload(id) {
    const program = this.programs.get(id);
    if (!program) return;
    this.programs.delete(id);
    program.unloaded = true;
    this.release(program.owned, program.sharedKeys);
    for (const free of program.staging.values()) for (const s of free) s.destroy();
    program.staging.clear();
    program.segments = [];
  }

  /** Destroy a program's own buffers; drop its references to persistent ones. */
  release(owned, sharedKeys) {
    for (const b of owned) b.destroy();
    for (const key of sharedKeys) {
      const shared = this.persistent.get(key);
      if (shared && --shared.refs === 0) {
        shared.buffer.destroy();
        this.persistent.delete(key);
      }
    }
  }
}
