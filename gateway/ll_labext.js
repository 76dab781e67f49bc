/* LooseLeaf's edit-time hints for JupyterLab 4 and Notebook 7: a prebuilt ("federated") extension, written by
 * hand so that it needs no npm build.  `looseleaf install` writes it, with its package.json, into
 * <data dir>/labextensions/looseleaf-hints/ (gateway/ll_labext.c); JupyterLab's page loads this file as
 * static/remoteEntry.<hash>.js and treats it as a webpack module federation container:
 * window._JUPYTERLAB[name].init(shareScope), then .get('./extension') giving a factory of the module whose
 * default export is the plugin.
 *
 * What it does: while the user edits a code cell of a notebook whose kernel is LooseLeaf (kernel_info's
 * implementation "looseleaf"), it sends the cell's text on a `looseleaf.prefetch` comm, at most one message
 * per THROTTLE_MS (the latest text wins); the kernel debounces these hints and prepares the GPU worker for the
 * cell about to run (gateway/ll_exec.c).  It opens no popup, binds no key and changes nothing in the editor, so
 * typing is exactly as in stock JupyterLab, for every kernel; a notebook on any other kernel gets no message.
 *
 * The notebook tracker is JupyterLab's own INotebookTracker, taken from the page's webpack share scope
 * (@jupyterlab/notebook is a shared singleton there): a plugin's `requires` are matched by token identity. */
var _JUPYTERLAB;
(function () {
  'use strict';

  var NAME = 'looseleaf-hints';
  var TARGET = 'looseleaf.prefetch';
  var THROTTLE_MS = 150;
  var shareScope = null;

  /* The highest version of shared module NAME in the page's share scope, loaded. */
  function shared(name) {
    var versions = shareScope && shareScope[name];
    if (!versions || !Object.keys(versions).length) {
      return Promise.reject(new Error(NAME + ': ' + name + ' is not shared by this page'));
    }
    var best = Object.keys(versions).sort(function (a, b) {
      var x = a.split(/[.-]/), y = b.split(/[.-]/);
      for (var i = 0; i < Math.max(x.length, y.length); i++) {
        var p = parseInt(x[i] || '0', 10), q = parseInt(y[i] || '0', 10);
        if (p !== q) return (isNaN(p) ? -1 : p) - (isNaN(q) ? -1 : q);
      }
      return 0;
    }).pop();
    var entry = versions[best];
    entry.loaded = 1;
    /* get() gives the module's factory, or (a lazily loaded module) a promise of it. */
    return Promise.resolve(entry.get()).then(function (factory) { return factory(); });
  }

  /* Per kernel connection: whether it is LooseLeaf (a promise), and its open hint comm. */
  function KernelHints(kernel) {
    this.kernel = kernel;
    this.comm = null;
    this.isLooseLeaf = Promise.resolve(kernel.info).then(function (info) {
      return !!info && info.implementation === 'looseleaf';
    }, function () { return false; });
  }

  KernelHints.prototype.send = function (code) {
    var self = this;
    return this.isLooseLeaf.then(function (yes) {
      if (!yes || self.kernel.isDisposed || !self.kernel.handleComms) return;
      /* A restart disposes the kernel's comms: open a new one then. */
      if (!self.comm || self.comm.isDisposed) {
        self.comm = self.kernel.createComm(TARGET);
        self.comm.open({});
      }
      self.comm.send({ code: code });
    }).catch(function (err) {
      console.debug(NAME + ': hint not sent', err);
    });
  };

  function activate(app, tracker) {
    var byKernel = new WeakMap();
    var watched = null; /* {cell, panel} of the cell whose edits are hinted */
    var timer = null, lastSent = 0;

    function flush() {
      timer = null;
      if (!watched || watched.cell.isDisposed) return;
      var kernel = watched.panel.sessionContext && watched.panel.sessionContext.session &&
        watched.panel.sessionContext.session.kernel;
      if (!kernel) return;
      var hints = byKernel.get(kernel);
      if (!hints || hints.kernel !== kernel) {
        hints = new KernelHints(kernel);
        byKernel.set(kernel, hints);
      }
      lastSent = Date.now();
      hints.send(watched.cell.model.sharedModel.getSource());
    }

    function onChange(sender, change) {
      if (!change || !change.sourceChange || timer !== null) return;
      timer = setTimeout(flush, Math.max(0, THROTTLE_MS - (Date.now() - lastSent)));
    }

    function watch(cell) {
      if (watched && watched.cell.model) {
        watched.cell.model.sharedModel.changed.disconnect(onChange);
      }
      /* A hint still waiting goes now, the cell's last draft.  When the user left the cell by running it,
       * this comes before the cell's execute_request (checked in the page), which supersedes it in the
       * kernel; when the user clicked elsewhere, the kernel can still prepare for the cell as it was left. */
      if (timer !== null) {
        clearTimeout(timer);
        flush();
      }
      watched = null;
      if (!cell || !cell.model || cell.model.type !== 'code' || !tracker.currentWidget) return;
      watched = { cell: cell, panel: tracker.currentWidget };
      cell.model.sharedModel.changed.connect(onChange);
    }

    tracker.activeCellChanged.connect(function (sender, cell) { watch(cell); });
    watch(tracker.activeCell);
  }

  var container = {
    init: function (scope) {
      shareScope = scope;
    },
    get: function (module) {
      if (module !== './extension') {
        return Promise.reject(new Error('Module "' + module + '" does not exist in container.'));
      }
      return shared('@jupyterlab/notebook').then(function (notebook) {
        var plugin = {
          id: NAME + ':plugin',
          description: 'Sends the cell being edited to a LooseLeaf kernel, to prepare its GPU worker.',
          autoStart: true,
          requires: [notebook.INotebookTracker],
          activate: activate
        };
        return function () { return { __esModule: true, default: [plugin] }; };
      });
    }
  };
  _JUPYTERLAB = self._JUPYTERLAB = self._JUPYTERLAB || {};
  _JUPYTERLAB[NAME] = container;
})();
