// Stand-ins for Prisma's native query engine and schema engine executables, built on the WebAssembly builds of
// the same engines that Prisma publishes to npm, for machines that reach the package registries and nothing else.
//
// Prisma Client Python runs a native `query-engine` binary as an HTTP server and speaks the GraphQL protocol to
// it; the Prisma CLI runs a native `schema-engine` binary and speaks JSON-RPC over stdin/stdout. Both binaries
// come from Prisma's download host, never from npm. What npm does carry is @prisma/query-engine-wasm (the query
// engine of Prisma 5.17, JSON protocol only) and @prisma/schema-engine-wasm (here Prisma 7.10's), each driving
// PostgreSQL through @prisma/adapter-pg and node-postgres.
//
//   node _litellm_prisma_engines.mjs query-engine --version | -p PORT [...]   (PRISMA_RAW_RESULTS=columns|objects)
//   node _litellm_prisma_engines.mjs schema-engine --version | cli --datasource URL COMMAND | -d SCHEMA [...]
//
// The query engine side turns each GraphQL document Prisma Client Python builds into the equivalent JSON-protocol
// request, runs it on the wasm engine, and answers in the shape the GraphQL protocol has (the `result` alias, bare
// scalars, raw results as the client's engine line wrote them). The schema engine side forwards the CLI's JSON-RPC
// calls to the wasm engine, reading the migration files it is now handed instead of a folder. Where the adapters
// fall short of the native engines (catalog column types, scripts with dollar-quoted blocks, the shadow database),
// the fix is made here and says so. Its node_modules folder (next to this file once installed) holds the packages
// under alias names, because the two engines need different versions of the PostgreSQL adapter.

import { createRequire } from 'node:module';
import { readFile, readdir } from 'node:fs/promises';
import http from 'node:http';
import path from 'node:path';
import readline from 'node:readline';
import { fileURLToPath, pathToFileURL } from 'node:url';
import os from 'node:os';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
const ENGINE_HASH = '393aa359c9ad4a4bb28630fb5613f9c281cde053';

// ---------------------------------------------------------------------------------------------------------------
// shared: loading wasm-bindgen output written for bundlers, and PostgreSQL URLs in Prisma's dialect

async function loadWasmBindgen(dir, stem, { start }) {
  const glue = await import(pathToFileURL(path.join(dir, `${stem}_bg.js`)).href);
  const module = await WebAssembly.compile(await readFile(path.join(dir, `${stem}_bg.wasm`)));
  const imports = {};
  for (const entry of WebAssembly.Module.imports(module)) imports[entry.module] = glue;
  const instance = await WebAssembly.instantiate(module, imports);
  glue.__wbg_set_wasm(instance.exports);
  if (start && typeof instance.exports.__wbindgen_start === 'function') instance.exports.__wbindgen_start();
  return glue;
}

function packageDir(name) {
  return path.join(HERE, 'node_modules', name);
}

// Prisma's connection URL carries pool settings node-postgres does not know; they become pool options instead.
function pgConfig(url) {
  const parsed = new URL(url);
  const params = parsed.searchParams;
  const seconds = (key) => (params.has(key) ? Number(params.get(key)) * 1000 : undefined);
  const schema = params.get('schema') || undefined;
  const options = [params.get('options') || '', schema ? `-c search_path="${schema}"` : ''].filter(Boolean);
  const config = {
    host: decodeURIComponent(parsed.hostname) || '127.0.0.1',
    port: parsed.port ? Number(parsed.port) : 5432,
    user: decodeURIComponent(parsed.username) || undefined,
    password: parsed.password ? decodeURIComponent(parsed.password) : undefined,
    database: decodeURIComponent(parsed.pathname.replace(/^\//, '')) || undefined,
    max: params.has('connection_limit') ? Number(params.get('connection_limit')) : os.cpus().length * 2 + 1,
    connectionTimeoutMillis: seconds('pool_timeout') ?? seconds('connect_timeout') ?? 10000,
    options: options.length ? options.join(' ') : undefined,
  };
  return { config, schema };
}

// Prisma 7 engines take connection URLs from their adapter only and reject them in schema files.
function withoutUrls(text) {
  return text.replace(/datasource\s+\w+\s*\{[^}]*\}/gm, (block) =>
    block.replace(/^\s*(url|directUrl|shadowDatabaseUrl)\s*=.*$/gm, ''),
  );
}

// PostgreSQL's catalog types `name` and one-byte `"char"` (and their arrays) have no mapping in the adapters, which
// then refuse the whole result; the native engines read them as text. node-postgres hands them over as strings,
// so their columns are declared text before the adapter looks at them.
const CATALOG_AS_TEXT = new Map([
  [18, 25],
  [19, 25],
  [1002, 1009],
  [1003, 1009],
]);

function catalogTextClient() {
  const pg = require('pg');
  const asText = (result) => {
    for (const field of result?.fields ?? []) {
      field.dataTypeID = CATALOG_AS_TEXT.get(field.dataTypeID) ?? field.dataTypeID;
    }
    return result;
  };
  return class CatalogTextClient extends pg.Client {
    query(...args) {
      const last = args.length - 1;
      if (typeof args[last] === 'function') {
        const callback = args[last];
        args[last] = (error, result) => callback(error, asText(result));
        return super.query(...args);
      }
      const pending = super.query(...args);
      return pending && typeof pending.then === 'function' ? pending.then(asText) : pending;
    }
  };
}

function datasourceUrlFromSchema(text) {
  const block = /datasource\s+\w+\s*\{([^}]*)\}/m.exec(text);
  if (!block) return undefined;
  const fromEnv = /\burl\s*=\s*env\(\s*"([^"]+)"\s*\)/.exec(block[1]);
  if (fromEnv) return process.env[fromEnv[1]];
  const literal = /\burl\s*=\s*"([^"]+)"/.exec(block[1]);
  return literal ? literal[1] : undefined;
}

// ---------------------------------------------------------------------------------------------------------------
// query engine: GraphQL (as Prisma Client Python writes it) to Prisma's JSON protocol

class RawNumber {
  constructor(text) {
    this.text = text;
  }
}

function tokenize(source) {
  const tokens = [];
  let i = 0;
  while (i < source.length) {
    const c = source[i];
    if (c === ' ' || c === '\n' || c === '\t' || c === '\r' || c === ',') {
      i += 1;
    } else if ('{}()[]:'.includes(c)) {
      tokens.push({ kind: c });
      i += 1;
    } else if (c === '"') {
      let j = i + 1;
      while (j < source.length && source[j] !== '"') j += source[j] === '\\' ? 2 : 1;
      tokens.push({ kind: 'value', value: JSON.parse(source.slice(i, j + 1)) });
      i = j + 1;
    } else if (c === '-' || (c >= '0' && c <= '9')) {
      const match = /^-?\d+(\.\d+)?([eE][+-]?\d+)?/.exec(source.slice(i));
      tokens.push({ kind: 'value', value: new RawNumber(match[0]) });
      i += match[0].length;
    } else if (/[_A-Za-z]/.test(c)) {
      const match = /^[_A-Za-z][_0-9A-Za-z]*/.exec(source.slice(i));
      const word = match[0];
      if (word === 'true' || word === 'false' || word === 'null') {
        tokens.push({ kind: 'value', value: word === 'null' ? null : word === 'true' });
      } else {
        tokens.push({ kind: 'name', value: word });
      }
      i += word.length;
    } else {
      throw new Error(`unexpected character ${JSON.stringify(c)} in query`);
    }
  }
  return tokens;
}

class Parser {
  constructor(source) {
    this.tokens = tokenize(source);
    this.at = 0;
  }
  peek(kind) {
    return this.tokens[this.at]?.kind === kind;
  }
  take(kind) {
    const token = this.tokens[this.at];
    if (!token || token.kind !== kind) throw new Error(`expected ${kind} at token ${this.at} of the query`);
    this.at += 1;
    return token.value;
  }
  document() {
    this.take('name'); // query | mutation
    this.take('{');
    const alias = this.take('name');
    let field = alias;
    if (this.peek(':')) {
      this.take(':');
      field = this.take('name');
    }
    const args = this.peek('(') ? this.arguments() : {};
    const selection = this.peek('{') ? this.selectionSet() : null;
    this.take('}');
    return { field, args, selection };
  }
  arguments() {
    this.take('(');
    const args = {};
    while (!this.peek(')')) {
      const key = this.take('name');
      this.take(':');
      args[key] = this.value();
    }
    this.take(')');
    return args;
  }
  value() {
    if (this.peek('value')) return this.take('value');
    if (this.peek('name')) return this.take('name'); // an enum literal
    if (this.peek('[')) {
      this.take('[');
      const items = [];
      while (!this.peek(']')) items.push(this.value());
      this.take(']');
      return items;
    }
    this.take('{');
    const object = {};
    while (!this.peek('}')) {
      const key = this.take('name');
      this.take(':');
      object[key] = this.value();
    }
    this.take('}');
    return object;
  }
  selectionSet() {
    this.take('{');
    const fields = [];
    while (!this.peek('}')) {
      const name = this.take('name');
      const args = this.peek('(') ? this.arguments() : null;
      const selection = this.peek('{') ? this.selectionSet() : null;
      fields.push({ name, args, selection });
    }
    this.take('}');
    return fields;
  }
}

const MODEL_ACTIONS = [
  'findUnique',
  'findFirst',
  'findMany',
  'createOne',
  'createMany',
  'updateOne',
  'updateMany',
  'upsertOne',
  'deleteOne',
  'deleteMany',
  'aggregate',
  'groupBy',
];

function splitOperation(field) {
  if (field === 'queryRaw' || field === 'executeRaw') return { action: field };
  for (const action of MODEL_ACTIONS) {
    if (field.startsWith(action) && field.length > action.length) {
      let modelName = field.slice(action.length);
      let name = action;
      if ((action === 'findUnique' || action === 'findFirst') && modelName.endsWith('OrThrow')) {
        modelName = modelName.slice(0, -'OrThrow'.length);
        name = `${action}OrThrow`;
      }
      return { modelName, action: name };
    }
  }
  throw new Error(`unsupported operation ${field}`);
}

function jsonSelection(fields) {
  const out = {};
  for (const field of fields) {
    if (!field.args && !field.selection) {
      out[field.name] = true;
    } else {
      out[field.name] = {
        arguments: field.args ?? {},
        selection: field.selection ? jsonSelection(field.selection) : { $scalars: true },
      };
    }
  }
  return out;
}

// Json fields: the GraphQL protocol reads a string given for one as JSON text, the JSON protocol as a JSON string
// value unless it is tagged, so every string bound for a Json field (or a Json filter's operand) gets the tag.
function modelFields(datamodel) {
  const models = new Map();
  for (const match of datamodel.matchAll(/^\s*(?:model|view)\s+(\w+)\s*\{([\s\S]*?)^\s*\}/gm)) {
    const fields = new Map();
    for (const line of match[2].split('\n')) {
      const field = /^\s*(\w+)\s+(\w+)(\[\])?/.exec(line);
      if (field) fields.set(field[1], { type: field[2], list: Boolean(field[3]) });
    }
    models.set(match[1], fields);
  }
  return models;
}

const asJson = (value) => (typeof value === 'string' ? { $type: 'Json', value } : value);

class JsonTagger {
  constructor(datamodel) {
    this.models = modelFields(datamodel);
  }
  data(model, value) {
    if (Array.isArray(value)) return value.map((item) => this.data(model, item));
    const fields = this.models.get(model);
    if (!fields || value === null || typeof value !== 'object' || value instanceof RawNumber) return value;
    const out = {};
    for (const [key, item] of Object.entries(value)) {
      const field = fields.get(key);
      if (field?.type === 'Json') {
        out[key] = Array.isArray(item)
          ? item.map(asJson)
          : item?.set !== undefined
            ? { set: asJson(item.set) }
            : asJson(item);
      } else if (field && this.models.has(field.type)) {
        out[key] = this.nested(field.type, item);
      } else {
        out[key] = item;
      }
    }
    return out;
  }
  // Nested writes on a relation field: create/update/upsert/createMany/connectOrCreate carry the related model's data.
  nested(model, ops) {
    if (ops === null || typeof ops !== 'object') return ops;
    const out = {};
    for (const [op, item] of Object.entries(ops)) {
      if (op === 'create' || op === 'update' || op === 'data') out[op] = this.dataOrWrapped(model, item);
      else if (op === 'upsert' || op === 'connectOrCreate' || op === 'createMany' || op === 'updateMany') {
        out[op] = Array.isArray(item) ? item.map((one) => this.nested(model, one)) : this.nested(model, item);
      } else if (op === 'where') out[op] = this.where(model, item);
      else out[op] = item;
    }
    return out;
  }
  dataOrWrapped(model, item) {
    // `update` on a to-many relation is {where, data}; on a to-one it is the data itself.
    const wrapped = (one) =>
      one && typeof one === 'object' && 'data' in one && 'where' in one
        ? this.nested(model, one)
        : this.data(model, one);
    return Array.isArray(item) ? item.map(wrapped) : wrapped(item);
  }
  where(model, value) {
    if (Array.isArray(value)) return value.map((item) => this.where(model, item));
    const fields = this.models.get(model);
    if (!fields || value === null || typeof value !== 'object' || value instanceof RawNumber) return value;
    const out = {};
    for (const [key, item] of Object.entries(value)) {
      const field = fields.get(key);
      if (key === 'AND' || key === 'OR' || key === 'NOT') out[key] = this.where(model, item);
      else if (field?.type === 'Json' && item && typeof item === 'object' && !Array.isArray(item)) {
        const filter = { ...item };
        for (const op of ['equals', 'not', 'array_contains', 'array_starts_with', 'array_ends_with']) {
          if (op in filter) filter[op] = asJson(filter[op]);
        }
        out[key] = filter;
      } else if (field && this.models.has(field.type) && item && typeof item === 'object') {
        const relation = {};
        for (const [op, inner] of Object.entries(item)) {
          relation[op] = ['some', 'every', 'none', 'is', 'isNot'].includes(op)
            ? this.where(field.type, inner)
            : this.where(field.type, { [op]: inner })[op];
        }
        out[key] = relation;
      } else out[key] = item;
    }
    return out;
  }
  args(model, action, args) {
    if (!model) return args;
    const out = { ...args };
    if ('data' in out) out.data = this.data(model, out.data);
    if (action === 'upsertOne') {
      if ('create' in out) out.create = this.data(model, out.create);
      if ('update' in out) out.update = this.data(model, out.update);
    }
    if ('where' in out) out.where = this.where(model, out.where);
    return out;
  }
}

function toJsonProtocol(graphql, tagger) {
  const { field, args, selection } = new Parser(graphql).document();
  const { modelName, action } = splitOperation(field);
  const query = {
    arguments: tagger.args(modelName, action, args),
    selection: selection ? jsonSelection(selection) : {},
  };
  const request = { action, query };
  if (modelName) request.modelName = modelName;
  return request;
}

// JSON.stringify that writes numbers exactly as they were written in the query (big integers stay exact).
function stringify(value) {
  if (value instanceof RawNumber) return value.text;
  if (value === null || typeof value !== 'object') return JSON.stringify(value);
  if (Array.isArray(value)) return `[${value.map(stringify).join(',')}]`;
  return `{${Object.entries(value)
    .map(([key, item]) => `${JSON.stringify(key)}:${stringify(item)}`)
    .join(',')}}`;
}

// The JSON protocol tags DateTime, BigInt, Decimal, Bytes and Json values; the GraphQL protocol sends them bare.
function untag(value) {
  if (Array.isArray(value)) return value.map(untag);
  if (value === null || typeof value !== 'object') return value;
  if (typeof value.$type === 'string' && 'value' in value && Object.keys(value).length === 2) return value.value;
  const out = {};
  for (const [key, item] of Object.entries(value)) out[key] = untag(item);
  return out;
}

// Raw results: the native engine hands json columns over as JSON values, the adapter path as their text.
function parseJsonColumns(raw) {
  if (!raw || !Array.isArray(raw.types) || !Array.isArray(raw.rows)) return raw;
  const parse = (value) => (typeof value === 'string' ? JSON.parse(value) : value);
  raw.types.forEach((type, column) => {
    if (type !== 'json' && type !== 'json-array') return;
    for (const row of raw.rows) {
      if (row[column] === null) continue;
      row[column] = type === 'json' ? parse(row[column]) : row[column].map(parse);
    }
  });
  return raw;
}

// Engines before Prisma 5.6 (the ones Prisma Client Python up to 0.12 expects) answered a raw query with one object
// per row and a {prisma__type, prisma__value} pair per column; PRISMA_RAW_RESULTS=objects selects that shape.
function typedValue(type, value) {
  if (value === null) return { prisma__type: 'null', prisma__value: null };
  if (type.endsWith('-array')) {
    const element = type.slice(0, -'-array'.length);
    return { prisma__type: 'array', prisma__value: value.map((item) => typedValue(element, item)) };
  }
  return { prisma__type: type, prisma__value: value };
}

function rawResult(raw) {
  parseJsonColumns(raw);
  if (process.env.PRISMA_RAW_RESULTS !== 'objects' || !Array.isArray(raw?.rows)) return raw;
  return raw.rows.map((row) =>
    Object.fromEntries(raw.columns.map((column, i) => [column, typedValue(raw.types[i], row[i])])),
  );
}

function asResult(response) {
  if (response.errors || !response.data) return response;
  const [key] = Object.keys(response.data);
  const value = untag(response.data[key]);
  return { data: { result: key === 'queryRaw' ? rawResult(value) : value } };
}

async function queryEngine(argv) {
  if (argv.includes('--version')) {
    process.stdout.write(`query-engine ${ENGINE_HASH}\n`);
    return;
  }
  const portAt = argv.findIndex((arg) => arg === '-p' || arg === '--port');
  const port = portAt >= 0 ? Number(argv[portAt + 1]) : 4466;
  const datamodel = await readFile(process.env.PRISMA_DML_PATH, 'utf8');
  let url = datasourceUrlFromSchema(datamodel);
  if (process.env.OVERWRITE_DATASOURCES) {
    const [first] = JSON.parse(process.env.OVERWRITE_DATASOURCES);
    if (first?.url) url = first.url;
  }
  if (!url) throw new Error('no datasource URL: set DATABASE_URL');

  const glue = await loadWasmBindgen(path.join(packageDir('qe-wasm'), 'postgresql'), 'query_engine', {
    start: false,
  });
  const pg = require('pg');
  const { PrismaPg } = require('qe-adapter-pg');
  const { bindAdapter } = require('qe-adapter-utils');
  const { config, schema } = pgConfig(url);
  const pool = new pg.Pool({ ...config, Client: catalogTextClient() });
  const adapter = bindAdapter(new PrismaPg(pool, schema ? { schema } : undefined));
  const log = (line) => {
    try {
      const event = JSON.parse(line);
      if (event.level === 'error' || event.level === 'ERROR') process.stderr.write(`${line}\n`);
    } catch {
      // not JSON: nothing to report
    }
  };
  const engine = new glue.QueryEngine({ datamodel, logLevel: 'error', logQueries: false }, log, adapter);
  const tagger = new JsonTagger(datamodel);
  await engine.connect('{}');

  const run = async (body, txId) => {
    const payload = JSON.parse(body);
    if (Array.isArray(payload.batch)) {
      const batch = payload.batch.map((item) => toJsonProtocol(item.query, tagger));
      const transaction = payload.transaction ? '{}' : 'null';
      const request = `{"batch":[${batch.map(stringify).join(',')}],"transaction":${transaction}}`;
      const response = JSON.parse(await engine.query(request, '{}', txId));
      if (Array.isArray(response.batchResult)) response.batchResult = response.batchResult.map(asResult);
      return response;
    }
    const request = stringify(toJsonProtocol(payload.query, tagger));
    return asResult(JSON.parse(await engine.query(request, '{}', txId)));
  };

  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (chunk) => chunks.push(chunk));
    req.on('end', async () => {
      const body = Buffer.concat(chunks).toString('utf8');
      const reply = (status, data) => {
        const text = typeof data === 'string' ? data : JSON.stringify(data);
        res.writeHead(status, { 'content-type': 'application/json', 'content-length': Buffer.byteLength(text) });
        res.end(text);
      };
      try {
        const route = req.url.split('?')[0];
        const tx = /^\/transaction\/([^/]+)\/(commit|rollback)$/.exec(route);
        if (req.method === 'GET' && route === '/status') {
          reply(200, { status: 'ok' });
        } else if (req.method === 'POST' && route === '/') {
          reply(200, await run(body, req.headers['x-transaction-id'] || undefined));
        } else if (req.method === 'POST' && route === '/transaction/start') {
          const answer = await engine.startTransaction(body || '{}', '{}');
          reply(JSON.parse(answer).id ? 200 : 400, answer);
        } else if (req.method === 'POST' && tx) {
          const call = tx[2] === 'commit' ? engine.commitTransaction : engine.rollbackTransaction;
          const answer = await call.call(engine, tx[1], '{}');
          reply(JSON.parse(answer).error_code ? 400 : 200, answer);
        } else if (req.method === 'GET' && route === '/metrics') {
          const format = new URL(req.url, 'http://x').searchParams.get('format') || 'json';
          reply(200, await engine.metrics(JSON.stringify({ format })));
        } else {
          reply(404, { error: `no route ${req.method} ${route}` });
        }
      } catch (error) {
        reply(500, {
          errors: [
            {
              error: String(error?.stack || error),
              user_facing_error: { is_panic: false, message: String(error?.message || error) },
            },
          ],
        });
      }
    });
  });
  server.keepAliveTimeout = 60000;
  server.listen(port, '127.0.0.1');
  const stop = async () => {
    server.close();
    await engine.disconnect('{}').catch(() => {});
    await pool.end().catch(() => {});
    process.exit(0);
  };
  process.on('SIGINT', stop);
  process.on('SIGTERM', stop);
}

// ---------------------------------------------------------------------------------------------------------------
// schema engine: the Prisma 5 CLI's JSON-RPC calls, forwarded to the wasm schema engine

const NO_FILTER = { externalTables: [], externalEnums: [] };

async function migrationsList(baseDir) {
  const names = [];
  for (const entry of (await readdir(baseDir, { withFileTypes: true })).sort((a, b) => a.name.localeCompare(b.name))) {
    if (entry.isDirectory()) names.push(entry.name);
  }
  const migrationDirectories = [];
  for (const name of names) {
    let content;
    try {
      content = { tag: 'ok', value: await readFile(path.join(baseDir, name, 'migration.sql'), 'utf8') };
    } catch (error) {
      content = { tag: 'error', value: String(error.message) };
    }
    migrationDirectories.push({ path: name, migrationFile: { path: 'migration.sql', content } });
  }
  let lockContent = null;
  try {
    lockContent = await readFile(path.join(baseDir, 'migration_lock.toml'), 'utf8');
  } catch {
    lockContent = null;
  }
  return {
    baseDir,
    lockfile: { path: 'migration_lock.toml', content: lockContent },
    shadowDbInitScript: '',
    migrationDirectories,
  };
}

function engineError(error) {
  // The wasm engine rejects with the user-facing error as JSON in the message when it has one.
  let detail = null;
  try {
    detail = JSON.parse(error?.message ?? '');
  } catch {
    detail = null;
  }
  const message = detail?.message ?? String(error?.message ?? error);
  return {
    code: 4466,
    message: 'An error happened. Check the data field for details.',
    data: {
      is_panic: Boolean(detail?.is_panic),
      message,
      meta: detail?.meta ?? null,
      error_code: detail?.error_code ?? null,
    },
  };
}

function logLine(level, fields) {
  process.stderr.write(
    `${JSON.stringify({ timestamp: new Date().toISOString(), level, fields, target: 'schema_engine::logger' })}\n`,
  );
}

async function withClient(url, fn) {
  const pg = require('pg');
  const client = new pg.Client(pgConfig(url).config);
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function schemaEngineCli(argv) {
  const url = argv[argv.indexOf('--datasource') + 1];
  const command = argv[argv.length - 1];
  const database = decodeURIComponent(new URL(url).pathname.replace(/^\//, ''));
  const maintenance = new URL(url);
  maintenance.pathname = '/postgres';
  try {
    if (command === 'can-connect-to-database') {
      await withClient(url, (client) => client.query('SELECT 1'));
    } else if (command === 'create-database') {
      await withClient(maintenance.href, (client) =>
        client.query(`CREATE DATABASE "${database.replaceAll('"', '""')}"`),
      );
    } else if (command === 'drop-database') {
      await withClient(maintenance.href, (client) =>
        client.query(`DROP DATABASE IF EXISTS "${database.replaceAll('"', '""')}"`),
      );
    } else {
      throw new Error(`unsupported command ${command}`);
    }
  } catch (error) {
    const missing = error?.code === '3D000';
    logLine('ERROR', {
      error_code: missing ? 'P1003' : 'P1001',
      message: missing ? `Database \`${database}\` does not exist` : String(error?.message ?? error),
    });
    process.exit(1);
  }
}

// The adapter runs a migration script by splitting it on every `;`, which cuts the DO $$ ... $$ blocks of LiteLLM's
// migrations in half; the native engine sends the whole script as one simple query, and so does this.
function wholeScripts(adapter) {
  adapter.executeScript = async function executeScript(script) {
    try {
      await this.client.query(script);
    } catch (error) {
      this.onError(error);
    }
  };
  return adapter;
}

async function schemaEngine(argv) {
  if (argv.includes('--version')) {
    process.stdout.write(`schema-engine-cli ${ENGINE_HASH}\n`);
    return;
  }
  if (argv[0] === 'cli') {
    await schemaEngineCli(argv);
    return;
  }
  const datamodels = [];
  for (let i = 0; i < argv.length; i += 1) {
    if (argv[i] === '-d' || argv[i] === '--datamodels' || argv[i] === '--datamodel') {
      const file = path.resolve(argv[i + 1]);
      datamodels.push([file, await readFile(file, 'utf8')]);
      i += 1;
    }
  }
  const schemaUrl =
    datamodels.map(([, text]) => datasourceUrlFromSchema(text)).find(Boolean) ?? process.env.DATABASE_URL;
  const bare = datamodels.map(([file, content]) => [file, withoutUrls(content)]);
  const schemas = { files: bare.map(([file, content]) => ({ path: file, content })) };
  const bareFiles = (files) => (files ?? []).map((file) => ({ ...file, content: withoutUrls(file.content) }));

  const glue = await loadWasmBindgen(packageDir('se-wasm'), 'schema_engine', { start: true });
  const { PrismaPg } = require('se-adapter-pg');
  const { bindMigrationAwareSqlAdapterFactory } = require('se-adapter-utils');
  const pg = require('pg');
  class WholeScriptPg extends PrismaPg {
    async connect() {
      return wholeScripts(await super.connect());
    }
    // The adapter drops its shadow database while its own pool still holds a connection to it, which PostgreSQL
    // refuses; this one closes the pool first.
    async connectToShadowDb() {
      const main = await this.connect();
      const database = `prisma_migrate_shadow_db_${globalThis.crypto.randomUUID()}`;
      await main.executeScript(`CREATE DATABASE "${database}"`);
      const pool = new pg.Pool({ ...this.config, database });
      const Adapter = main.constructor;
      return wholeScripts(
        new Adapter(pool, undefined, async () => {
          await pool.end();
          await main.executeScript(`DROP DATABASE "${database}"`);
          await main.dispose();
        }),
      );
    }
  }
  const log = (line) => {
    if (typeof line === 'string' && /"level":"(ERROR|WARN)"/i.test(line)) process.stderr.write(`${line}\n`);
  };
  // One engine per database: the schema's own, or the one a `migrate diff --from-url/--to-url` names.
  const engines = new Map();
  const engineFor = (url) => {
    if (!url) throw new Error('no datasource URL: set DATABASE_URL');
    if (!engines.has(url)) {
      const { config, schema } = pgConfig(url);
      const options = schema ? { schema } : undefined;
      const factory = bindMigrationAwareSqlAdapterFactory(
        new WholeScriptPg({ ...config, Client: catalogTextClient() }, options),
      );
      engines.set(url, glue.SchemaEngine.new({ datamodels: bare.length ? bare : undefined }, log, factory));
    }
    return engines.get(url);
  };
  const engine = () => engineFor(schemaUrl);

  // A live database as a diff side: the wasm engine reaches databases only through its adapter, as "the schema's
  // datasource", so a URL becomes an engine on that URL and a datasource block with nothing else in it.
  const diffTarget = async (target, urls) => {
    if (target?.tag === 'migrations') return { tag: 'migrations', ...(await migrationsList(target.path)) };
    if (target?.tag === 'url') {
      urls.push(target.url);
      const files = [{ path: 'datasource.prisma', content: 'datasource db {\n  provider = "postgresql"\n}\n' }];
      return { tag: 'schemaDatasource', files, configDir: process.cwd() };
    }
    if (target?.tag === 'schemaDatasource') {
      return { tag: 'schemaDatasource', files: bareFiles(target.files), configDir: process.cwd() };
    }
    if (target?.tag === 'schemaDatamodel') return { tag: 'schemaDatamodel', files: bareFiles(target.files) };
    return target;
  };
  let printed = 0;

  const methods = {
    listMigrationDirectories: async ({ migrationsDirectoryPath }) => {
      const list = await migrationsList(migrationsDirectoryPath);
      return { migrations: list.migrationDirectories.map((entry) => entry.path) };
    },
    applyMigrations: async ({ migrationsDirectoryPath }) =>
      (await engine()).applyMigrations({
        migrationsList: await migrationsList(migrationsDirectoryPath),
        filters: NO_FILTER,
      }),
    diagnoseMigrationHistory: async ({ migrationsDirectoryPath, optInToShadowDatabase }) =>
      (await engine()).diagnoseMigrationHistory({
        migrationsList: await migrationsList(migrationsDirectoryPath),
        optInToShadowDatabase: Boolean(optInToShadowDatabase),
        filters: NO_FILTER,
      }),
    markMigrationApplied: async ({ migrationsDirectoryPath, migrationName }) =>
      (await engine()).markMigrationApplied({
        migrationName,
        migrationsList: await migrationsList(migrationsDirectoryPath),
      }),
    markMigrationRolledBack: async (params) => (await engine()).markMigrationRolledBack(params),
    getDatabaseVersion: async (params) => (await engine()).version(params ?? null),
    ensureConnectionValidity: async (params) => (await engine()).ensureConnectionValidity(params),
    dbExecute: async (params) => {
      const url = params.datasourceType?.tag === 'url' ? params.datasourceType.url : schemaUrl;
      return (await engineFor(url)).dbExecute(params);
    },
    schemaPush: async ({ schema: pushed, force }) =>
      (await engine()).schemaPush({
        schema: pushed ? { files: bareFiles(pushed.files) } : schemas,
        force: Boolean(force),
        filters: NO_FILTER,
      }),
    diff: async (params) => {
      const urls = [];
      const from = await diffTarget(params.from, urls);
      const to = await diffTarget(params.to, urls);
      if (new Set(urls).size > 1) throw new Error('a diff between two live databases is not supported here');
      const result = await (
        await engineFor(urls[0] ?? schemaUrl)
      ).diff({
        from,
        to,
        script: Boolean(params.script),
        exitCode: params.exitCode ?? null,
        shadowDatabaseUrl: params.shadowDatabaseUrl ?? null,
        filters: NO_FILTER,
      });
      // The Prisma 5 CLI prints what the engine sends it in a `print` request; it answers on stdin, ignored below.
      if (result.stdout) {
        printed += 1;
        const request = { jsonrpc: '2.0', id: `print-${printed}`, method: 'print', params: { content: result.stdout } };
        process.stdout.write(`${JSON.stringify(request)}\n`);
      }
      return { exitCode: result.exitCode };
    },
  };

  const lines = readline.createInterface({ input: process.stdin });
  let pending = Promise.resolve();
  lines.on('line', (line) => {
    if (!line.trim()) return;
    const request = JSON.parse(line);
    if (typeof request.method !== 'string') return; // the CLI acknowledging a print
    pending = pending.then(async () => {
      const handler = methods[request.method];
      let response;
      if (!handler) {
        const error = { code: -32601, message: `Method not found: ${request.method}` };
        response = { jsonrpc: '2.0', id: request.id, error };
      } else {
        try {
          const result = await handler(request.params ?? {});
          response = { jsonrpc: '2.0', id: request.id, result: result ?? null };
        } catch (error) {
          response = { jsonrpc: '2.0', id: request.id, error: engineError(error) };
        }
      }
      process.stdout.write(`${JSON.stringify(response)}\n`);
    });
  });
  lines.on('close', () => {
    pending.then(() => process.exit(0));
  });
}

// ---------------------------------------------------------------------------------------------------------------

const [mode, ...rest] = process.argv.slice(2);
const main = mode === 'query-engine' ? queryEngine : mode === 'schema-engine' ? schemaEngine : null;
if (!main) {
  process.stderr.write('usage: _litellm_prisma_engines.mjs query-engine|schema-engine ARGS...\n');
  process.exit(2);
}
main(rest).catch((error) => {
  process.stderr.write(`${error?.stack ?? error}\n`);
  process.exit(1);
});
