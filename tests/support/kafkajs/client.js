#!/usr/bin/env node
// KafkaJS as a real client for corrfix's tests; tests/support/kafkajs.py runs it.
//
//   node client.js produce --brokers H:P --topic T --count N [--acks 0|1|-1] [--batch B]
//                          [--concurrency C] [--hold-after H] [--after-disconnect exit|linger]
//                          [--prefix m-] [--start 0] [--timeout-ms 30000]
//   node client.js consume --brokers H:P --topic T --group G --expected N
//                          [--timeout-ms 30000] [--session-timeout-ms 6000] [--values]
//
// produce: one producer session. It connects and sends the values `${prefix}${i}` (i
// zero-padded to 6 digits, as corrfix/workload.py's make_value) for i in [start, start +
// count), `batch` messages per send(), with up to `concurrency` sends awaited at a time (1:
// one after the other). Then it calls producer.disconnect() at once, and either the process
// exits (`exit`: a script's end; the kernel closes the sockets) or it lives on (`linger`):
// its half-closed sockets keep reading until the broker closes them (10 s at most), as a
// long-lived process's would. With --hold-after H it stops once the sends of the first H messages are
// done (the connections are up then), prints a `hold` event and waits for a line on stdin.
//
// consume: one group member (from the beginning when the group has no offsets) that reads
// until it has `expected` messages or `timeout-ms` passes, commits, and leaves.
//
// stdout carries JSON lines only: events ({"event": ...}: `hold`, and `disconnected` right
// after producer.disconnect() returns), then the summary as the last line. KafkaJS's own
// log (warn and up) goes to stderr. The exit code is 0 unless the client threw; then the
// process ends at once.

'use strict'

const net = require('net')
const readline = require('readline')
const { Kafka, logLevel, Partitioners } = require('kafkajs')

function parseArgs(argv) {
  const [mode, ...rest] = argv
  const options = {}
  for (let i = 0; i < rest.length; i++) {
    const arg = rest[i]
    if (!arg.startsWith('--')) throw new Error(`unexpected argument ${JSON.stringify(arg)}`)
    const key = arg.slice(2)
    const next = rest[i + 1]
    if (next === undefined || next.startsWith('--')) {
      options[key] = true
    } else {
      options[key] = next
      i++
    }
  }
  return { mode, options }
}

function required(options, key) {
  if (options[key] === undefined || options[key] === true) throw new Error(`--${key} is required`)
  return options[key]
}

function integer(options, key, fallback) {
  const text = options[key] === undefined ? String(fallback) : options[key]
  const value = Number.parseInt(text, 10)
  if (!Number.isFinite(value)) throw new Error(`--${key} wants an integer, got ${JSON.stringify(text)}`)
  return value
}

function makeValue(prefix, i) {
  return `${prefix}${String(i).padStart(6, '0')}`
}

function emit(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, ...fields })}\n`)
}

// One line from stdin (or its end), then stdin is let go so that it keeps nothing alive.
function stdinLine() {
  return new Promise((resolve) => {
    const lines = readline.createInterface({ input: process.stdin })
    let done = false
    const finish = () => {
      if (done) return
      done = true
      lines.close()
      process.stdin.destroy()
      resolve()
    }
    lines.once('line', finish)
    lines.once('close', finish)
  })
}

// KafkaJS logs through this: JSON lines on stderr, so stdout carries only events and the summary.
function stderrLogCreator() {
  return ({ namespace, label, log }) => {
    const { message, ...extra } = log
    process.stderr.write(`${JSON.stringify({ level: label, namespace, message, ...extra })}\n`)
  }
}

// KafkaJS's default socket factory (plain TCP only), remembering every socket it made, so
// that a lingering process can wait for the broker to close them after disconnect().
const sockets = new Set()
const LINGER_LIMIT_MS = 10000 // a lingering process waits this long at most for the broker

function trackingSocketFactory({ host, port, onConnect }) {
  const socket = net.connect({ host, port }, onConnect)
  socket.setKeepAlive(true, 60000)
  sockets.add(socket)
  return socket
}

// Resolves with 0 once every socket is closed, or after timeoutMs with the number still open.
function socketsClosed(timeoutMs) {
  const open = [...sockets].filter((socket) => !socket.destroyed)
  return new Promise((resolve) => {
    let left = open.length
    if (left === 0) return resolve(0)
    const timer = setTimeout(() => resolve(left), timeoutMs)
    for (const socket of open) {
      socket.once('close', () => {
        if (--left === 0) {
          clearTimeout(timer)
          resolve(0)
        }
      })
    }
  })
}

function client(options, timeoutMs) {
  return new Kafka({
    socketFactory: trackingSocketFactory,
    clientId: options['client-id'] || 'corrfix-tests-kafkajs',
    brokers: String(required(options, 'brokers')).split(','),
    logLevel: logLevel.WARN,
    logCreator: stderrLogCreator,
    connectionTimeout: Math.min(10000, timeoutMs),
    requestTimeout: Math.min(10000, timeoutMs),
    retry: { retries: 3, initialRetryTime: 100, maxRetryTime: 1000 },
  })
}

async function produce(options) {
  const topic = required(options, 'topic')
  const count = integer(options, 'count')
  const acks = integer(options, 'acks', -1)
  const batch = Math.max(1, integer(options, 'batch', 100))
  const concurrency = Math.max(1, integer(options, 'concurrency', 1))
  const holdAfter = options['hold-after'] === undefined ? null : integer(options, 'hold-after')
  const after = options['after-disconnect'] === undefined ? 'exit' : options['after-disconnect']
  if (after !== 'exit' && after !== 'linger') throw new Error('--after-disconnect is exit or linger')
  const start = integer(options, 'start', 0)
  const prefix = options.prefix === undefined ? 'm-' : String(options.prefix)
  const timeoutMs = integer(options, 'timeout-ms', 30000)

  const batches = []
  for (let first = start; first < start + count; first += batch) {
    const messages = []
    for (let i = first; i < Math.min(first + batch, start + count); i++) {
      messages.push({ value: makeValue(prefix, i) })
    }
    batches.push(messages)
  }
  // The batches sent before the hold: enough to cover the first holdAfter messages.
  const beforeHold = holdAfter === null ? batches.length : Math.min(Math.ceil(holdAfter / batch), batches.length)

  const producer = client(options, timeoutMs).producer({
    allowAutoTopicCreation: false,
    createPartitioner: Partitioners.DefaultPartitioner,
  })
  let sent = 0
  let requests = 0
  // `concurrency` senders take the batches in order, each awaiting its send() before the next.
  const sendAll = async (list) => {
    let next = 0
    const sender = async () => {
      while (next < list.length) {
        const messages = list[next++]
        await producer.send({ topic, acks, timeout: timeoutMs, messages })
        sent += messages.length
        requests++
      }
    }
    await Promise.all(Array.from({ length: Math.min(concurrency, list.length) }, sender))
  }

  const began = Date.now()
  await producer.connect()
  try {
    await sendAll(batches.slice(0, beforeHold))
    if (holdAfter !== null) {
      emit('hold', { sent })
      await stdinLine()
    }
    await sendAll(batches.slice(beforeHold))
  } finally {
    // Right after the last send: the scenario of issue #13.
    await producer.disconnect()
  }
  emit('disconnected', { sent })
  const summary = {
    mode: 'produce',
    topic,
    acks,
    batch,
    concurrency,
    after_disconnect: after,
    attempted: count,
    sent,
    requests,
    elapsed_ms: Date.now() - began,
  }
  if (after === 'linger') {
    const lingerStart = Date.now()
    summary.sockets_left_open = await socketsClosed(Math.min(timeoutMs, LINGER_LIMIT_MS))
    summary.linger_ms = Date.now() - lingerStart
  }
  return summary
}

async function consume(options) {
  const topic = required(options, 'topic')
  const group = required(options, 'group')
  const expected = integer(options, 'expected')
  const timeoutMs = integer(options, 'timeout-ms', 30000)
  const sessionTimeout = integer(options, 'session-timeout-ms', 6000)
  const consumer = client(options, timeoutMs).consumer({
    groupId: group,
    sessionTimeout,
    rebalanceTimeout: Math.max(sessionTimeout, 10000),
    heartbeatInterval: Math.max(100, Math.floor(sessionTimeout / 6)),
    maxWaitTimeInMs: 100, // Tansu's long poll does not wake early when data arrives
    allowAutoTopicCreation: false,
  })
  const began = Date.now()
  const values = []
  let finished
  const done = new Promise((resolve) => {
    finished = resolve
  })
  const timer = setTimeout(() => finished('timeout'), timeoutMs)
  let stopped = 'error'
  await consumer.connect()
  try {
    await consumer.subscribe({ topics: [topic], fromBeginning: true })
    await consumer.run({
      autoCommit: true,
      eachMessage: async ({ message }) => {
        values.push(message.value === null ? null : message.value.toString())
        if (values.length >= expected) finished('expected')
      },
    })
    if (expected <= 0) finished('expected')
    stopped = await done
  } finally {
    clearTimeout(timer)
    await consumer.disconnect() // commits what eachMessage returned from
  }
  const counts = new Map()
  for (const value of values) counts.set(value, (counts.get(value) || 0) + 1)
  const summary = {
    mode: 'consume',
    topic,
    group,
    expected,
    count: values.length,
    unique: counts.size,
    duplicates: [...counts.values()].filter((c) => c > 1).length,
    stopped,
    elapsed_ms: Date.now() - began,
  }
  if (options.values) summary.values = values
  return summary
}

async function main() {
  const { mode, options } = parseArgs(process.argv.slice(2))
  const modes = { produce, consume }
  if (!modes[mode]) throw new Error(`mode must be one of ${Object.keys(modes).join(', ')}, got ${mode}`)
  const summary = await modes[mode](options)
  process.stdout.write(`${JSON.stringify(summary)}\n`)
}

// After an error the client may still hold sockets and retry timers (a failed connect() does
// not undo itself): the process ends once the error line is written, not when they let go.
main().catch((error) => {
  process.stderr.write(`${error && error.stack ? error.stack : error}\n`)
  process.stdout.write(`${JSON.stringify({ error: String((error && error.message) || error) })}\n`, () =>
    process.exit(1)
  )
})
