// The door scanner's script (door/pages.py). Without it the page's form
// posts to the page and the server judges the code. With it:
//
// - a scan asks the API (POST …/checkin/, the session's cookie and its CSRF
//   token) and shows the verdict large, in words and colour;
// - where the browser has BarcodeDetector and a camera, "Scan with the
//   camera" reads QR codes (a hardware scanner types into the field);
// - the offline list (GET …/checkin/list/) is fetched on load and every 30 s
//   while online, and kept in localStorage, compactly: the public keys, the
//   revoked tickets (id → newest revoked version) and the ids checked in;
// - when the network is gone (a failed request, a 5xx from a proxy, or
//   navigator.onLine false) the code is judged HERE: its format, its event,
//   its Ed25519 signature (WebCrypto), then the list and this phone's own
//   offline admissions; the scan is queued in localStorage and uploaded
//   (POST …/checkin/upload/) when the network is back;
// - the counter: admitted (the list's check-ins and this phone's since) of
//   expected (…/checkin/progress/, asked with the list).
//
// The code (door/codes.py): base64url, no padding, of a 25-byte payload
// (">BHIQQH": format 1, key version, event id, seat id, ticket id, ticket
// version) and its 64-byte Ed25519 signature.
(function () {
  "use strict";

  var root = document.querySelector("[data-door]");
  var configNode = document.getElementById("door-config");
  if (!root || !configNode) return;
  var config = JSON.parse(configNode.textContent);

  var LIST_EVERY_MS = 30000;     // the offline list, while online
  var RETRY_EVERY_MS = 10000;    // the upload of queued scans
  var ASK_TIMEOUT_MS = 5000;     // a scan waits this long for the server
  var SAME_CODE_MS = 3000;       // the camera sees a code many times a second
  var PAYLOAD_BYTES = 25;
  var CODE_BYTES = 89;
  var CODE_CHARS = 119;
  var CANONICAL_LAST = "AEIMQUYcgkosw048";
  var MAX_CODE_CHARS = 512;      // what the field takes; the API takes up to 2000
  var prefix = "boxoffice.door." + config.event_id + ".";
  var GATE_KEY = "boxoffice.door.gate";

  var form = root.querySelector("[data-scan-form]");
  var codeInput = form.querySelector("input[name=code]");
  var gateInput = form.querySelector("input[name=gate]");
  var verdict = root.querySelector("[data-scan-result]");
  var connection = root.querySelector("[data-connection]");
  var readyLine = root.querySelector("[data-offline-ready]");
  var queueLine = root.querySelector("[data-queue-count]");
  var problemLine = root.querySelector("[data-door-problem]");
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  var csrf = csrfMeta ? csrfMeta.content : "";

  // --- storage: never fatal (private mode, a full quota) ----------------------------

  function load(name, fallback) {
    try {
      var value = window.localStorage.getItem(prefix + name);
      return value === null ? fallback : JSON.parse(value);
    } catch (e) {
      return fallback;
    }
  }

  function save(name, value) {
    try {
      window.localStorage.setItem(prefix + name, JSON.stringify(value));
      return true;
    } catch (e) {
      say("This phone could not store the offline data (" + e.name + ").");
      return false;
    }
  }

  // The list as kept: {as_of, keys: [{version, key}], revoked: {ticket: version},
  // checked_in: {ticket: true}}. Admitted here: {ticket: {at, gate}}, this
  // phone's admissions not yet in a list. The queue: [{code, gate, at}].
  var list = load("list", null);
  var admittedHere = load("admitted", {});
  var queue = load("queue", []);
  var keys = {};          // key version → CryptoKey
  var offlineReady = "no";
  var online = navigator.onLine !== false;
  var seq = Number(verdict.getAttribute("data-scan-seq")) || 0;

  // --- the code -------------------------------------------------------------------------

  function bytesOf(base64) {
    try {
      var text = window.atob(base64);
      var bytes = new Uint8Array(text.length);
      for (var i = 0; i < text.length; i++) bytes[i] = text.charCodeAt(i);
      return bytes;
    } catch (e) {
      return null;
    }
  }

  // Only the canonical spelling, as the server (door.codes): 89 bytes are
  // 119 characters whose last one carries 2 spare bits, which must be 0.
  function fromBase64Url(code) {
    if (code.length !== CODE_CHARS || !/^[A-Za-z0-9_-]+$/.test(code)) return null;
    if (CANONICAL_LAST.indexOf(code.charAt(code.length - 1)) < 0) return null;
    var base64 = code.replace(/-/g, "+").replace(/_/g, "/");
    while (base64.length % 4) base64 += "=";
    return bytesOf(base64);
  }

  // The code's payload, or null when it is not one (door.codes.parse).
  function parse(code) {
    var bytes = fromBase64Url(code);
    if (!bytes || bytes.length !== CODE_BYTES || bytes[0] !== 1) return null;
    var view = new DataView(bytes.buffer);
    return {
      keyVersion: view.getUint16(1),
      eventId: view.getUint32(3),
      seatId: String(view.getBigUint64(7)),
      ticketId: String(view.getBigUint64(15)),
      ticketVersion: view.getUint16(23),
      payload: bytes.slice(0, PAYLOAD_BYTES),
      signature: bytes.slice(PAYLOAD_BYTES)
    };
  }

  // --- the screen -------------------------------------------------------------------------

  function say(text) {
    problemLine.textContent = text || "";
    problemLine.hidden = !text;
  }

  function utcTime(iso) {
    var when = new Date(iso);
    return isNaN(when) ? "" : when.toISOString().slice(11, 19) + " UTC";
  }

  function show(answer, offline) {
    var result = config.verdicts[answer.result] ? answer.result : "invalid";
    var words = config.verdicts[result];
    var detail = words.detail;
    if (result === "already_checked_in" && answer.checked_in_at) {
      detail += " Checked in " + utcTime(answer.checked_in_at) + (answer.gate ? " at " + answer.gate : "") + ".";
    }
    if (offline) detail += " (Judged on this phone, offline.)";
    verdict.className = "verdict verdict--" + result;
    verdict.setAttribute("data-scan-result", result);
    verdict.setAttribute("data-scan-offline", offline ? "yes" : "no");
    verdict.setAttribute("data-scan-seq", String(++seq));
    verdict.querySelector("[data-verdict-word]").textContent = words.word;
    verdict.querySelector("[data-verdict-seat]").textContent = answer.seat ? "Seat " + answer.seat : "";
    verdict.querySelector("[data-verdict-detail]").textContent = detail;
    if (result !== "ok" && navigator.vibrate) navigator.vibrate([200, 100, 200]);
  }

  function setOnline(now) {
    online = now;
    render();
  }

  function paintConnection() {
    connection.setAttribute("data-connection", online ? "online" : "offline");
    connection.querySelector("[data-connection-text]").textContent = online
      ? "Online"
      : offlineReady === "yes"
        ? "Offline: codes are checked on this phone and uploaded when the network is back"
        : "Offline: no code can be checked (see below)";
  }

  function counted() {
    var seen = {};
    var n = 0;
    var checkedIn = list ? list.checked_in : {};
    Object.keys(checkedIn).concat(Object.keys(admittedHere)).forEach(function (ticket) {
      if (!seen[ticket]) { seen[ticket] = true; n++; }
    });
    return n;
  }

  function render() {
    paintConnection();
    if (list) root.querySelector("[data-admitted]").textContent = String(counted());
    readyLine.setAttribute("data-offline-ready", offlineReady);
    if (offlineReady === "yes") {
      readyLine.textContent = "Offline checks ready (list of " + utcTime(list.as_of) + ").";
    } else if (offlineReady === "unsupported") {
      readyLine.textContent = "Offline checks are unavailable in this browser (it cannot verify " +
        "Ed25519 signatures, or the page is not on HTTPS): without the network, no code can be checked.";
    }
    queueLine.setAttribute("data-queue-count", String(queue.length));
    queueLine.textContent = queue.length
      ? queue.length + " offline scan" + (queue.length === 1 ? "" : "s") + " waiting to upload."
      : "No scans waiting to upload.";
  }

  // --- asking the server -----------------------------------------------------------------

  // {status, body} from the server, or {network: true} when it could not be
  // reached (no network, a timeout, a proxy's 502/503/504).
  function ask(url, body, timeoutMs) {
    if (navigator.onLine === false) return Promise.resolve({network: true});
    var abort = new AbortController();
    var timer = window.setTimeout(function () { abort.abort(); }, timeoutMs || ASK_TIMEOUT_MS);
    var request = {credentials: "same-origin", headers: {Accept: "application/json"}, signal: abort.signal};
    if (body !== null) {
      request.method = "POST";
      request.headers["Content-Type"] = "application/json";
      request.headers["X-CSRFToken"] = csrf;
      request.body = JSON.stringify(body);
    }
    return window.fetch(url, request)
      .then(function (response) {
        if (response.status >= 500) return {network: true};
        return response.json().catch(function () { return {}; }).then(function (json) {
          return {status: response.status, body: json};
        });
      })
      .catch(function () { return {network: true}; })
      .finally(function () { window.clearTimeout(timer); });
  }

  function refused(answer) {
    var detail = (answer.body && answer.body.detail) || "";
    if (answer.status === 401 || answer.status === 403) {
      say("The server refused (" + answer.status + "): " + detail + " Log in again if your session ended.");
    } else {
      say("The server refused (" + answer.status + "): " + detail);
    }
  }

  // --- the offline list ------------------------------------------------------------------

  function importKeys(kept) {
    if (!window.crypto || !window.crypto.subtle) return Promise.reject(new Error("no WebCrypto"));
    return Promise.all(kept.map(function (entry) {
      return window.crypto.subtle
        .importKey("raw", bytesOf(entry.key), {name: "Ed25519"}, false, ["verify"])
        .then(function (key) { return [entry.version, key]; });
    })).then(function (pairs) {
      keys = {};
      pairs.forEach(function (pair) { keys[pair[0]] = pair[1]; });
    });
  }

  function compact(answer) {
    var revoked = {};
    (answer.revoked || []).forEach(function (code) {
      var p = parse(code);
      if (p && !(revoked[p.ticketId] >= p.ticketVersion)) revoked[p.ticketId] = p.ticketVersion;
    });
    var checkedIn = {};
    (answer.checked_in || []).forEach(function (code) {
      var p = parse(code);
      if (p) checkedIn[p.ticketId] = true;
    });
    var kept = answer.public_keys && answer.public_keys.length
      ? answer.public_keys.map(function (k) { return {version: k.version, key: k.key}; })
      : [];
    return {as_of: answer.as_of, keys: kept, revoked: revoked, checked_in: checkedIn};
  }

  function adopt(kept) {
    list = kept;
    // This phone's admissions that the server now knows need no keeping.
    Object.keys(admittedHere).forEach(function (ticket) {
      if (kept.checked_in[ticket] && !queued(ticket)) delete admittedHere[ticket];
    });
    save("admitted", admittedHere);
    return importKeys(kept.keys).then(
      function () { offlineReady = kept.keys.length ? "yes" : "no"; },
      function () { offlineReady = "unsupported"; }
    ).then(render);
  }

  function refreshList() {
    return ask(config.list_url, null, 15000).then(function (answer) {
      if (answer.network) { setOnline(false); return; }
      setOnline(true);
      if (answer.status !== 200) { refused(answer); return; }
      var kept = compact(answer.body);
      save("list", kept);
      return adopt(kept).then(refreshExpected);
    });
  }

  // How many may come in moves with sales and refunds: asked with the list.
  function refreshExpected() {
    return ask(config.progress_url, null).then(function (answer) {
      if (answer.status === 200 && typeof answer.body.expected === "number") {
        root.querySelector("[data-expected]").textContent = String(answer.body.expected);
      }
    });
  }

  // --- judging a code here ---------------------------------------------------------------

  function queued(ticket) {
    return queue.some(function (scan) { var p = parse(scan.code); return p && p.ticketId === ticket; });
  }

  function seatOf(p) {
    return config.seats[p.seatId] || "#" + p.seatId;
  }

  // {result, seat?, checked_in_at?, gate?}, as the API answers, judged here.
  function judgeHere(code, p) {
    if (!p) return Promise.resolve({result: "invalid"});
    if (p.eventId !== config.event_id) return Promise.resolve({result: "wrong_event"});
    var key = keys[p.keyVersion];
    if (!key) return Promise.resolve({result: "invalid"});
    return window.crypto.subtle.verify({name: "Ed25519"}, key, p.signature, p.payload)
      .catch(function () { return false; })
      .then(function (good) {
        if (!good) return {result: "invalid"};
        var seat = seatOf(p);
        if (list.revoked[p.ticketId] >= p.ticketVersion) return {result: "revoked", seat: seat};
        var here = admittedHere[p.ticketId];
        if (here) return {result: "already_checked_in", seat: seat, checked_in_at: here.at, gate: here.gate};
        if (list.checked_in[p.ticketId]) return {result: "already_checked_in", seat: seat};
        return {result: "ok", seat: seat};
      });
  }

  function scanHere(code, gate) {
    if (offlineReady !== "yes") {
      say(offlineReady === "unsupported"
        ? "Offline: this browser cannot check codes without the network. Do not admit on a guess."
        : "Offline, and the offline list never loaded: no code can be checked. Do not admit on a guess.");
      return Promise.resolve();
    }
    var p = parse(code);
    return judgeHere(code, p).then(function (answer) {
      var at = new Date().toISOString();
      // Uploaded later, as the API keeps every scan; but not a repeat this
      // phone refused as already in: the upload cannot say it was refused,
      // and the server would record it as a second admission (a conflict).
      if (answer.result !== "already_checked_in") {
        queue.push({code: code.slice(0, MAX_CODE_CHARS), gate: gate, at: at});
      }
      if (answer.result === "ok") admittedHere[p.ticketId] = {at: at, gate: gate};
      save("queue", queue);
      save("admitted", admittedHere);
      show(answer, true);
      render();
    });
  }

  // --- uploading what was judged here ------------------------------------------------------

  var uploading = false;

  function sameScan(a, b) {
    return a.code === b.code && a.gate === b.gate && a.at === b.at;
  }

  function upload() {
    if (uploading || !queue.length) return Promise.resolve();
    uploading = true;
    var batch = queue.slice(0, 200);
    return ask(config.upload_url, {scans: batch}, 20000).then(function (answer) {
      uploading = false;
      if (answer.network) { setOnline(false); return; }
      setOnline(true);
      if (answer.status !== 200) { refused(answer); return; }
      queue = load("queue", queue).filter(function (scan) {
        return !batch.some(function (sent) { return sameScan(sent, scan); });
      });
      save("queue", queue);
      forgetRefused(answer.body.results || []);
      render();
      return queue.length ? upload() : refreshList();
    }, function () { uploading = false; });
  }

  // An admission made here that the server refused (the ticket was refunded
  // while this phone was offline): it no longer counts as admitted here.
  function forgetRefused(results) {
    var conflicts = 0;
    results.forEach(function (r) {
      var p = parse(r.code || "");
      if (r.conflict) conflicts++;
      if (p && r.result !== "ok" && r.result !== "already_checked_in") delete admittedHere[p.ticketId];
    });
    save("admitted", admittedHere);
    say(conflicts
      ? conflicts + " uploaded scan" + (conflicts === 1 ? " was" : "s were") + " of a ticket already let in elsewhere (a conflict, recorded)."
      : "");
  }

  // --- a scan ------------------------------------------------------------------------------

  var busy = false;

  function gate() {
    return gateInput.value.trim();
  }

  // A scan typed (or typed by a hardware scanner) gives the field its focus
  // back for the next; one from the camera does not (a phone's keyboard
  // would cover the verdict).
  function scan(code, typed) {
    code = code.trim();
    if (!code || busy) return;
    busy = true;
    var g = gate();
    var body = {code: code};
    if (g) body.gate = g;
    // Once a request has failed, scans are judged here at once (a door
    // cannot wait 5 s a ticket) until the network answers again: the
    // "online" event, or the probe every 10 s.
    (online ? ask(config.checkin_url, body) : Promise.resolve({network: true}))
      .then(function (answer) {
        if (answer.network) {
          setOnline(false);
          return scanHere(code, g);
        }
        setOnline(true);
        if (answer.status !== 200) { refused(answer); return; }
        say("");
        var p = parse(code);
        if (answer.body.result === "ok" && p) admittedHere[p.ticketId] = {at: answer.body.checked_in_at || new Date().toISOString(), gate: g};
        save("admitted", admittedHere);
        show(answer.body, false);
        render();
      })
      .finally(function () {
        busy = false;
        codeInput.value = "";
        if (typed) codeInput.focus();
      });
  }

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    scan(codeInput.value, true);
  });

  // --- the gate, remembered on this phone --------------------------------------------------

  try {
    if (!gateInput.value) gateInput.value = window.localStorage.getItem(GATE_KEY) || "";
  } catch (e) { /* no storage: typed each time */ }
  gateInput.addEventListener("input", function () {
    try { window.localStorage.setItem(GATE_KEY, gate()); } catch (e) { /* as above */ }
  });

  // --- the camera, where the browser reads QR codes ----------------------------------------

  function camera() {
    var box = root.querySelector("[data-camera]");
    var missing = root.querySelector("[data-camera-missing]");
    var hasIt = "BarcodeDetector" in window && navigator.mediaDevices && navigator.mediaDevices.getUserMedia;
    if (!hasIt) { missing.hidden = false; return; }
    window.BarcodeDetector.getSupportedFormats().then(function (formats) {
      if (formats.indexOf("qr_code") < 0) { missing.hidden = false; return; }
      box.hidden = false;
      wireCamera(box);
    }, function () { missing.hidden = false; });
  }

  function wireCamera(box) {
    var button = box.querySelector("[data-action=camera]");
    var video = box.querySelector("[data-camera-video]");
    var detector = new window.BarcodeDetector({formats: ["qr_code"]});
    var stream = null;
    var last = {code: "", at: 0};

    function stop() {
      if (stream) stream.getTracks().forEach(function (track) { track.stop(); });
      stream = null;
      video.hidden = true;
      button.setAttribute("aria-pressed", "false");
      button.textContent = "Scan with the camera";
    }

    function look() {
      if (!stream) return;
      detector.detect(video).then(function (found) {
        var code = found.length ? found[0].rawValue : "";
        var now = Date.now();
        if (code && (code !== last.code || now - last.at > SAME_CODE_MS)) {
          last = {code: code, at: now};
          scan(code, false);
        }
      }).catch(function () { /* a frame not ready yet */ }).then(function () {
        window.setTimeout(look, 150);
      });
    }

    button.addEventListener("click", function () {
      if (stream) { stop(); return; }
      navigator.mediaDevices.getUserMedia({video: {facingMode: {ideal: "environment"}}, audio: false})
        .then(function (s) {
          stream = s;
          video.srcObject = s;
          video.hidden = false;
          button.setAttribute("aria-pressed", "true");
          button.textContent = "Stop the camera";
          return video.play().then(look);
        })
        .catch(function (e) { stop(); say("The camera could not start (" + e.name + ")."); });
    });
    document.addEventListener("visibilitychange", function () { if (document.hidden) stop(); });
  }

  // --- start -------------------------------------------------------------------------------

  // Back online: the queue first (its scans happened first), then the list.
  function reconnect() {
    return queue.length ? upload() : refreshList();
  }

  window.addEventListener("online", function () {
    setOnline(true);
    reconnect();
  });
  window.addEventListener("offline", function () { setOnline(false); });
  window.setInterval(function () { if (online) refreshList(); }, LIST_EVERY_MS);
  // The retry: the queue's upload, or a probe of a network that failed.
  window.setInterval(function () { if (queue.length || !online) reconnect(); }, RETRY_EVERY_MS);

  camera();
  render();
  // The list kept from before (this page reloaded), then the server's.
  (list ? adopt(list) : Promise.resolve()).then(reconnect);
})();
