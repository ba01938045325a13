// What the test page needs from viem, bundled for the browser by esbuild (tests/test_browser.py).
export { createPublicClient, http, webSocket } from "viem";
