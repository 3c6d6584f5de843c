// The buyer pages' little script (shop/). Everything works without it: the
// seats are checkboxes in a form, and a waiting purchase page reloads itself.
// With it: Enter toggles a seat too, the choice is summed up, the quantity
// steps aside while seats are ticked, the hold counts down, and each new
// status of a purchase is announced once to screen readers.
//
// In Stripe mode (docs/stripe.md, "The buyer's pages") it is needed: the
// seat map's card field is Stripe.js's card Element, and Buy first makes a
// PaymentMethod in the browser, then posts only its id (the card's number
// never reaches boxoffice); a purchase page whose purchase waits on the
// buyer's bank (3-D Secure) opens the bank's confirmation.
(function () {
  "use strict";

  function seatMap(form) {
    var seats = form.querySelectorAll("input.seat-input");
    var quantity = form.querySelector("input[name=quantity]");
    var summary = form.querySelector("[data-selection]");

    function update() {
      var chosen = [];
      seats.forEach(function (seat) { if (seat.checked) chosen.push(seat.value); });
      if (summary) {
        summary.textContent = chosen.length
          ? "Chosen: " + chosen.join(", ") + " (" + chosen.length + " seat" + (chosen.length === 1 ? "" : "s") + ")"
          : "";
      }
      if (quantity) {
        // Seats or a quantity, never both (the API's rule, which the server
        // holds the form to): a disabled field is not sent.
        quantity.disabled = chosen.length > 0;
      }
    }

    seats.forEach(function (seat) {
      seat.addEventListener("change", update);
      seat.addEventListener("keydown", function (event) {
        // Enter on a seat ticks it, as Space does, instead of sending the form.
        if (event.key === "Enter" && !seat.disabled) {
          event.preventDefault();
          seat.click();
        }
      });
    });
    update();
  }

  function countdowns(root) {
    root.querySelectorAll("[data-hold-countdown]").forEach(function (hold) {
      var until = Date.parse(hold.dataset.expiresAt);
      var text = hold.querySelector("[data-countdown-text]");
      if (!text || isNaN(until) || hold.dataset.ticking) return;
      hold.dataset.ticking = "yes";
      function tick() {
        if (!document.body.contains(hold)) return;  // replaced by a newer status
        var left = Math.max(0, Math.round((until - Date.now()) / 1000));
        var minutes = Math.floor(left / 60);
        var seconds = left % 60;
        text.textContent = left > 0
          ? " (" + minutes + " min " + (seconds < 10 ? "0" : "") + seconds + " s left)"
          : " (the hold has run out; we are settling it)";
        if (left > 0) window.setTimeout(tick, 1000);
      }
      tick();
    });
  }

  var lastStatus = null;

  function announce() {
    var announcer = document.querySelector("[data-status-announcer]");
    var status = document.querySelector("[data-purchase-status]");
    if (!announcer || !status) return;
    // A refund moves without moving the saga: its state counts as news too.
    var value = status.getAttribute("data-purchase-status") + "/" +
      (status.getAttribute("data-refund-state") || "");
    if (lastStatus !== null && value !== lastStatus) {
      var sentence = document.querySelector("[data-status-sentence]");
      announcer.textContent = status.textContent + ". " + (sentence ? sentence.textContent : "");
    }
    lastStatus = value;
  }

  // --- Stripe mode ------------------------------------------------------------------

  var stripeClient = null;

  // The page's Stripe.js client, made once with the publishable key the
  // page carries (shop/_stripe_js.html); null when Stripe.js did not load.
  function stripe() {
    var key = document.querySelector('meta[name="stripe-publishable-key"]');
    if (!stripeClient && key && typeof window.Stripe === "function") {
      stripeClient = window.Stripe(key.content);
    }
    return stripeClient;
  }

  // THE ONE CALL THAT DIFFERS UNDER LOCALSTRIPE (its Stripe.js stand-in):
  // docs/stripe.md, "The buyer's pages".
  // Stripe.js answers createPaymentMethod with {paymentMethod} or {error}.
  // The stand-in defines createPaymentMethod as a no-op that answers
  // undefined, and localstripe refuses a publishable key at POST
  // /v1/payment_methods (401: only a secret key makes a PaymentMethod
  // there). It takes one at POST /v1/tokens, which the stand-in's
  // createToken calls on the API base it derives from its own URL, that is
  // from STRIPE_JS_URL; the token's card (card_...) is what localstripe's
  // PaymentIntents take as their payment_method. So that undefined answer,
  // and nothing else, goes the stand-in's way; Stripe.js never comes here.
  // Answers {id} or {error: {message}}, never throws.
  function paymentMethodFor(client, card) {
    return Promise.resolve()
      .then(function () { return client.createPaymentMethod({type: "card", card: card}); })
      .then(function (answer) {
        if (answer !== undefined) {
          return answer.error ? {error: answer.error} : {id: answer.paymentMethod.id};
        }
        return client.createToken(card).then(function (made) {
          return made.error ? {error: made.error} : {id: made.token.card.id};
        });
      })
      .catch(function () {
        return {error: {message: "Your card could not be read. Check it, then press Buy again."}};
      });
  }

  function cardForm(form) {
    var mount = form.querySelector("[data-stripe-card]");
    var field = form.querySelector("input[data-payment-method]");
    if (!mount || !field) return;  // not Stripe mode, or not logged in yet
    var problem = form.querySelector("[data-card-error]");
    var buy = form.querySelector('[data-action="buy"]');

    function say(text) {
      problem.textContent = text;
      problem.hidden = !text;
    }

    var client = stripe();
    if (!client) {
      say("The card form could not load. Check your connection, then reload the page.");
      return;
    }
    var card = client.elements().create("card");
    card.mount(mount);
    var busy = false;

    form.addEventListener("submit", function (event) {
      if (field.value) return;  // made: the browser sends the form now
      event.preventDefault();
      // One payment method per Buy: a second click waits for the first.
      if (busy) return;
      busy = true;
      say("");
      buy.setAttribute("aria-busy", "true");
      paymentMethodFor(client, card).then(function (made) {
        if (made.error) {
          busy = false;
          buy.removeAttribute("aria-busy");
          say(made.error.message || "Your card was not accepted. Check it, then press Buy again.");
          return;
        }
        field.value = made.id;
        form.submit();  // not a submit event: this handler does not run again
      });
    });
  }

  // LOCALSTRIPE'S STAND-IN, ITS OTHER DIFFERENCE:
  // docs/stripe.md, "The buyer's pages".
  // It declares `class Element` at its top level, and a classic script's
  // top-level class is a global binding that hides the DOM's Element from
  // every script on the page: htmx's `instanceof Element` checks then fail,
  // and the purchase page would stop following its purchase. A page with no
  // card Element (the purchase page: confirmCardPayment only) gives the
  // name back to the DOM as soon as the stand-in has run, before htmx
  // starts at DOMContentLoaded. The seat map keeps the stand-in's Element
  // for its card, and uses no htmx. With Stripe.js, Element is the DOM's
  // already and nothing happens.
  function giveElementBack(script) {
    script.addEventListener("load", function () {
      if (document.querySelector("[data-stripe-card]")) return;
      if (Element !== window.Element) Element = window.Element;
    });
  }

  // shop.js runs before Stripe.js (both deferred, in this order in <head>).
  var stripeScript = document.querySelector("script[data-stripe-js]");
  if (stripeScript) giveElementBack(stripeScript);

  // What this page has done with each authentication (by client secret):
  // "open" while the bank's confirmation is shown, then "done" or "failed".
  // Kept here, not in the live part, which htmx replaces on every move.
  var authentications = {};

  var AUTHENTICATION_WORDS = {
    waiting: "Your bank's confirmation opens on this page. If it did not open, or you closed it, open it again:",
    open: "Your bank's confirmation is open: follow its steps.",
    done: "Your bank has answered. We are finishing your purchase; this page follows it.",
    failed: "Your bank did not confirm the payment, so nothing was charged. Try again, or wait: this page follows what happens next.",
  };

  function showAuthentication(box) {
    var secret = box.getAttribute("data-client-secret");
    var tried = authentications[secret] || {state: "waiting"};
    var button = box.querySelector('[data-action="authenticate"]');
    var text = box.querySelector("[data-authenticate-text]");
    box.setAttribute("data-authentication", tried.state);
    text.textContent = AUTHENTICATION_WORDS[tried.state] + (tried.message ? " (" + tried.message + ")" : "");
    button.hidden = tried.state === "done";
    button.disabled = tried.state === "open";
    button.textContent = tried.state === "failed" ? "Try again" : "Confirm with my bank";
  }

  function refreshAuthentication() {
    document.querySelectorAll("[data-authenticate]").forEach(showAuthentication);
  }

  // Stripe.js opens the bank's confirmation (3-D Secure) for the
  // PaymentIntent whose client secret this is; the saga learns the outcome
  // from Stripe (its event, or its next look-up), not from this page.
  function openAuthentication(client, secret) {
    authentications[secret] = {state: "open"};
    refreshAuthentication();
    Promise.resolve()
      .then(function () { return client.confirmCardPayment(secret); })
      .then(function (result) {
        var intent = result && result.paymentIntent;
        // localstripe's stand-in answers a failed authentication with the
        // PaymentIntent (status requires_payment_method), Stripe.js with an error.
        var through = intent && ["succeeded", "processing", "requires_capture"].indexOf(intent.status) >= 0;
        authentications[secret] = through
          ? {state: "done"}
          : {state: "failed", message: result && result.error && result.error.message};
      }, function () {
        authentications[secret] = {state: "failed"};
      })
      .then(refreshAuthentication);
  }

  function authenticate(root) {
    var box = root.querySelector("[data-authenticate]");
    if (!box) return;
    var client = stripe();
    if (!client) {
      box.querySelector("[data-authenticate-text]").textContent =
        "Your bank's confirmation could not load. Check your connection, then reload the page.";
      return;
    }
    var secret = box.getAttribute("data-client-secret");
    box.querySelector('[data-action="authenticate"]').onclick = function () {
      openAuthentication(client, secret);
    };
    if (!(secret in authentications)) {
      openAuthentication(client, secret);  // by itself, once per page
    } else {
      showAuthentication(box);
    }
  }

  document.addEventListener("DOMContentLoaded", function () {
    document.querySelectorAll("form[data-seat-map-form]").forEach(seatMap);
    document.querySelectorAll("form[data-seat-map-form]").forEach(cardForm);
    countdowns(document);
    announce();
    authenticate(document);
    var problem = document.getElementById("problem");
    if (problem) problem.focus();
  });

  // The purchase's live part was replaced (htmx, after a 200 to its poll).
  document.addEventListener("htmx:afterSettle", function (event) {
    countdowns(document);
    announce();
    authenticate(document);
  });
})();
