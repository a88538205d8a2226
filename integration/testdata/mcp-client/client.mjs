// A coding agent's MCP client, as an agent host runs one: the official TypeScript SDK starts the
// server given after "--" over stdio, in the working directory given first, then lists its tools.
// integration/mcp_test.go drives it one JSON line at a time on stdin:
//   {"tool": NAME, "args": {...}}  calls a tool: {"isError", "structured", "text"}
//   {"fetch": URL}                 fetches a URL, as the agent's own tools would: {"status", "body"}
// Every answer is one JSON line on stdout; the first is {"tools": [{name, inputSchema, outputSchema}]}.
import { createInterface } from "node:readline";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";

const [cwd, sep, command, ...args] = process.argv.slice(2);
if (sep !== "--" || !command) {
  console.error("usage: node client.mjs DIR -- COMMAND [ARG...]");
  process.exit(2);
}
const client = new Client({ name: "cockpitfs-test-agent", version: "1.0.0" });
await client.connect(new StdioClientTransport({ command, args, cwd, env: process.env, stderr: "inherit" }));
const { tools } = await client.listTools();
console.log(JSON.stringify({ tools: tools.map(({ name, inputSchema, outputSchema }) => ({ name, inputSchema, outputSchema })) }));

for await (const line of createInterface({ input: process.stdin })) {
  const req = JSON.parse(line);
  let answer;
  try {
    if (req.fetch) {
      const res = await fetch(req.fetch);
      answer = { status: res.status, body: await res.text() };
    } else {
      // callTool checks structuredContent against the tool's outputSchema.
      const res = await client.callTool({ name: req.tool, arguments: req.args ?? {} });
      answer = { isError: res.isError ?? false, structured: res.structuredContent, text: res.content.map((c) => c.text).join("") };
    }
  } catch (err) {
    answer = { exception: String(err) };
  }
  console.log(JSON.stringify(answer));
}
await client.close();
