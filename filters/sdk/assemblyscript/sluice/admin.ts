// sluice/admin: the sluice_admin export, for admin filters (`export * from "sluice/admin";`
// next to `export * from "sluice/abi";`). It hands Filter.onAdmin the request JSON.
import { beginCall, currentFilter, fail, hasFailed } from "./index";

let answer: ArrayBuffer = new ArrayBuffer(0);

export function sluice_admin(ptr: i32, len: i32): i64 {
  beginCall();
  const out = currentFilter().onAdmin(String.UTF8.decodeUnsafe(<usize>ptr, <usize>max(len, 0)));
  if (out === null || hasFailed()) {
    fail("admin handler failed");
    return -1;
  }
  answer = String.UTF8.encode(out);
  return (<i64>changetype<usize>(answer) << 32) | <i64>answer.byteLength;
}
