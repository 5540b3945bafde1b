// Types of runrecordd's API for clients/typescript/runrecordd.js: one
// interface per schema of pkg/api/openapi.json (Error is ApiError), each
// with exactly its properties (TestTypeScriptClient checks them).

export declare const DEFAULT_SOCKET: string;
export declare const routes: Record<string, string>;

export declare class RunrecorddError extends Error {
  code: string;
  status: number;
  body: Partial<ApiError>;
}

export declare class PinError extends Error {}

export declare function publicKeyOf(der: Buffer): Buffer;

export interface LogOptions {
  follow?: boolean;
  tail?: number;
  since?: string; // RFC 3339
}

export declare class Client {
  static unix(socketPath?: string): Client;
  static tls(address: string, certPem: string | Buffer, keyPem: string | Buffer, hostPublicKey: string): Client;
  run(unit: Partial<Spec> & { image: string }, grants?: Partial<Grants>, id?: string, secrets?: Record<string, string>): Promise<Run>;
  list(phase?: "executing" | "parked" | "closed"): Promise<Run[]>;
  show(id: string): Promise<Show>;
  park(id: string): Promise<Park>;
  resume(id: string, secrets?: Record<string, string>): Promise<Resume>;
  close(id: string, reason?: string): Promise<Run>;
  verify(id: string): Promise<Verify>;
  waitProof(id: string): Promise<WaitProof>;
  calls(): Promise<Call[]>;
  post(id: string, call: string, result: unknown): Promise<PostResult>;
  events(): AsyncGenerator<Event>;
  logs(id: string, options?: LogOptions): AsyncGenerator<Record<string, unknown>>;
  host(): Promise<Host>;
  openapi(): Promise<Record<string, unknown>>;
}

export interface Call {
  id: string;
  kind: string;
  payload: unknown;
  phase: string;
  result_posted: boolean;
  run: string;
}

export interface CallAccount {
  dispatched: string[];
  resolved: string[];
}

export interface Checkpoint {
  diff_ns: number;
  dump_ns: number;
  freezing_ns: number;
  frozen_ns: number;
  image_bytes: number;
  ingest_ns: number;
  mem_dump_ns: number;
  mem_write_ns: number;
  pages_scanned: number;
  pages_written: number;
  pause_ns: number;
  rootfs_bytes: number;
  total_ns: number;
}

export interface CloseRequest {
  reason: string;
}

export interface Dest {
  cidr?: string;
  name?: string;
  ports: string;
  proto: "tcp" | "udp";
}

export interface Drain {
  left: number;
  moved: number;
  runs: Drained[];
}

export interface DrainRequest {
  parallel?: number;
  to?: string[];
}

export interface Drained {
  error?: ApiError;
  run: string;
  to?: string;
  took_ns: number;
}

export interface Energy {
  inputs?: Record<string, string>;
  method?: string;
  provenance: string;
  uj: number;
}

export interface ApiError {
  code: "bad_request" | "not_found" | "exists" | "conflict" | "phase" | "snapshot_mismatch" | "manifest_mismatch" | "record_invalid" | "object_corrupt" | "missing_object" | "call_refused" | "unavailable" | "internal" | "checkpoint_failed" | "restore_failed" | "checkpoint_timeout" | "restore_timeout" | "pages_lost" | "image_parks_unavailable" | "daemon_unreachable" | "no_space" | "handed_off" | "genesis_held" | "untrusted_signer" | "grant_refused" | "image_refused" | "bundle_too_large" | "not_owner" | "draining" | "forbidden" | "quota" | "secrets_required" | "not_held";
  error: string;
  keys?: string[];
  segment?: number;
  signer?: string;
}

export interface Event {
  call?: string;
  call_kind?: string;
  detail?: string;
  kind: "run.started" | "run.parked" | "run.resumed" | "run.closed" | "call.dispatched" | "call.result" | "run.resident" | "run.pages-lost";
  run: string;
  time: string;
}

export interface GC {
  kept: number;
  kept_bytes: number;
  released: string[];
  removed: number;
  removed_bytes: number;
}

export interface GCRequest {
  grace_ns?: number;
  retention_ns?: number;
}

export interface Grants {
  egress?: Dest[];
  limits: Limits;
  memory_bytes: number;
  milli_cpu: number;
  network: "" | "none" | "loopback" | "egress";
  read_only: Mount[];
  secrets?: string[];
}

export interface Host {
  containerd: string;
  criu: CRIUBuild;
  embedded: boolean;
  host_root_images: boolean;
  image_parks: ImageParks;
  key_id: string;
  manifest: Record<string, string>;
  post_copy_holds?: PostCopyHold[];
  post_copy_owings?: PostCopyOwing[];
  rapl: boolean;
  rapl_reasons?: string[];
  state_dir: string;
  user_namespaces: boolean;
}

export interface PostCopyHold {
  ends: string;
  head: string;
  run: string;
  since: string;
  target: string;
}

export interface PostCopyOwing {
  head: string;
  reason?: string;
  run: string;
  slabs: number;
  source: string;
  state: "fetching" | "waiting" | "stopped" | "stranded";
  tried?: string;
}

export interface CRIUBuild {
  binary?: string;
  capabilities: string[];
  known: boolean;
  off?: string[];
  patches: CRIUFile[];
  source?: CRIUFile;
  unknown?: string;
  version: string;
}

export interface CRIUFile {
  name: string;
  sha256?: string;
}

export interface LogLine {
  base64?: string;
  error?: ApiError;
  interval?: number;
  omitted?: number;
  reason?: string;
  stream?: string;
  text?: string;
  time?: string;
}

export interface Image {
  digest: string;
  name: string;
}

export interface ImageParks {
  notes?: string[];
  probe_ns?: number;
  reason?: string;
  status: string;
  user_namespaces?: boolean;
}

export interface Import {
  bytes: number;
  grants: Grants;
  objects: number;
  run: Run;
  signers: Signer[];
  unclaimed?: ApiError;
}

export interface Limits {
  channel_conns?: number;
  channel_inflight_bytes?: number;
  interval_calls?: number;
  interval_payload_bytes?: number;
  log_bytes?: number;
  pids?: number;
  snapshot_bytes?: number;
  transcript_bytes?: number;
}

export interface MigrateRequest {
  to: string;
}

export interface Mount {
  source: string;
  target: string;
}

export interface Park {
  checkpoint?: Checkpoint;
  duration_ns: number;
  manifest: string;
  receipt: Energy;
  retained_bytes: number;
  run: Run;
  snapshot: string;
  steps?: Step[];
}

export interface ParkAll {
  left: number;
  parked: number;
  runs: ParkedRun[];
}

export interface ParkAllRequest {
  parallel?: number;
}

export interface ParkedRun {
  error?: ApiError;
  park?: Park;
  run: string;
}

export interface PostResult {
  awaiting?: string[];
  call: string;
  resume_error?: ApiError;
  resumed?: Resume;
  run: string;
}

export interface Restore {
  forking_ns: number;
  lazy?: boolean;
  materialize_ns: number;
  pages_lost?: string;
  pages_restored: number;
  resident_ns?: number;
  restore_ns: number;
  rootfs_ns: number;
  served?: boolean;
  task_ns: number;
  total_ns: number;
}

export interface Resume {
  duration_ns: number;
  idle: Energy;
  parked_ns: number;
  restore?: Restore;
  run: Run;
  steps?: Step[];
}

export interface ResumeRequest {
  secrets?: Record<string, string>;
}

export interface Run {
  grants_id: string;
  handed_off?: boolean;
  head: string;
  id: string;
  image?: string;
  mode?: string;
  parked_at?: string;
  phase: "executing" | "parked" | "closed";
  pinned?: boolean;
  released?: boolean;
  segments: number;
  started?: string;
  status: string;
  unit_id: string;
}

export interface RunRequest {
  grants: Grants;
  id?: string;
  secrets?: Record<string, string>;
  unit: Spec;
}

export interface Segment {
  attestation?: string;
  calls?: CallAccount;
  checkpoint?: Checkpoint;
  cpu_ns?: number;
  end?: string;
  form?: string;
  head: string;
  host?: string;
  idle?: Energy;
  index: number;
  interval?: number;
  kind: string;
  manifest?: string;
  outcome?: string;
  reason?: string;
  receipt?: Energy;
  restore?: Restore;
  snapshot?: string;
  start?: string;
}

export interface Show {
  grants?: Grants;
  restore?: Restore;
  run: Run;
  segments: Segment[];
  stdout?: string;
  totals: Totals;
  unit?: Spec;
  wait_proof: WaitProof;
}

export interface Signer {
  interval: number;
  key: string;
  name?: string;
  segment: number;
  trusted: boolean;
}

export interface Spec {
  args: string[];
  env: string[];
  image: string;
  image_digest: string;
  mode: "" | "image" | "transcript";
  nonce?: string;
}

export interface Step {
  name: string;
  ns: number;
}

export interface Totals {
  active_provenance: string;
  active_uj: number;
  cost_uj: number;
  idle_provenance: string;
  idle_uj: number;
}

export interface TrustedKey {
  key: string;
  name?: string;
  self?: boolean;
}

export interface Verify {
  bytes: number;
  error?: ApiError;
  head: string;
  objects: number;
  ok: boolean;
  owed?: number;
  owing?: PostCopyOwing;
  phase: string;
  run: string;
  segments: number;
  signers: Signer[];
  wait_proof: WaitProof;
}

export interface WaitProof {
  reason: string;
  segment?: number;
  verdict: string;
}
