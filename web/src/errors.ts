// Error classes of the runtime. Every message names the field, the dispatch or the input
// it is about, so that a user can act on it without reading the runtime's source.

/** A package that breaks a rule of the format, or that this adapter cannot run. */
export class PackageError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'PackageError';
  }
}

/** Where a kernel reported a bad index (see `RunError.dispatch`). */
export interface DispatchSite {
  /** Index of the dispatch in `manifest.dispatches`. */
  index: number;
  label: string;
  node: string;
  source: string;
}

/**
 * A call that failed: bad inputs, an index out of range reported through the status block,
 * a GPU error, or a lost device.
 */
export class RunError extends Error {
  /** The dispatch that reported an out-of-range index, when that is what happened. */
  readonly dispatch?: DispatchSite;
  /** The offending index value (status word 2, read as a signed 32-bit integer). */
  readonly badIndex?: number;

  constructor(message: string, detail: { dispatch?: DispatchSite; badIndex?: number } = {}) {
    super(message);
    this.name = 'RunError';
    if (detail.dispatch !== undefined) this.dispatch = detail.dispatch;
    if (detail.badIndex !== undefined) this.badIndex = detail.badIndex;
  }
}
