/**
 * kernel_gateway_stream's JupyterLab extension: notebook output that survives reloads,
 * dropped connections and gateway restarts.
 *
 * Two plugins:
 *
 * - `server-settings` provides JupyterLab's `IServerSettings` (a service-manager plugin,
 *   JupyterLab >= 4.4): the default settings with two changes, a WebSocket class that
 *   resumes kernel channels exactly (./socket.ts), and a `fetch` that keeps asking for a
 *   kernel's model while the server is out of reach, so that a dropped kernel connection
 *   reconnects within a second of the server's return (./patience.ts). Every other
 *   setting, and every service manager, stays JupyterLab's own.
 * - `restore` brings each notebook's cells up to date from the gateway when its kernel
 *   connection is ready (./restorer.ts).
 */

import type { JupyterFrontEnd, JupyterFrontEndPlugin } from '@jupyterlab/application';
import { Notification } from '@jupyterlab/apputils';
import { INotebookTracker, type NotebookPanel } from '@jupyterlab/notebook';
import {
  IServerSettings,
  ServerConnection,
  type ServiceManagerPlugin
} from '@jupyterlab/services';

import { patientFetch } from './patience';
import { NotebookRestorer } from './restorer';
import { ResumeLedger } from './resume';
import { resumingWebSocket } from './socket';

/**
 * The server settings, with the resuming WebSocket class.
 *
 * Lumino lets a later plugin override a service: federated extensions are registered
 * after JupyterLab's own, so this one replaces `@jupyterlab/services-extension:
 * server-settings`, which returns `ServerConnection.makeSettings()` as this does.
 */
const serverSettingsPlugin: ServiceManagerPlugin<ServerConnection.ISettings> = {
  id: 'kernel-gateway-stream:server-settings',
  description:
    'Server settings whose WebSocket resumes kernel channels from the last seq received, ' +
    "and whose fetch reconnects a kernel as soon as the server is back.",
  autoStart: true,
  provides: IServerSettings,
  activate: (_: null): ServerConnection.ISettings => {
    return ServerConnection.makeSettings({
      WebSocket: resumingWebSocket(WebSocket, new ResumeLedger()),
      fetch: patientFetch((input, init) => fetch(input, init))
    });
  }
};

const restorePlugin: JupyterFrontEndPlugin<void> = {
  id: 'kernel-gateway-stream:restore',
  description: "Restores notebook cells' output from the gateway's transcript.",
  autoStart: true,
  requires: [INotebookTracker],
  activate: (app: JupyterFrontEnd, tracker: INotebookTracker): void => {
    const settings = app.serviceManager.serverSettings;
    const notify = (message: string, kind: 'info' | 'warning') => {
      Notification.emit(message, kind, { autoClose: kind === 'info' ? 5000 : 15000 });
    };
    // One restorer per document: views of one notebook share its cell models.
    const restored = new WeakSet<object>();
    const add = (panel: NotebookPanel) => {
      if (restored.has(panel.context)) {
        return;
      }
      restored.add(panel.context);
      const restorer = new NotebookRestorer(panel.context, settings, notify);
      panel.context.disposed.connect(() => {
        restored.delete(panel.context);
        restorer.dispose();
      });
    };
    tracker.forEach(add);
    tracker.widgetAdded.connect((_, panel) => add(panel));
  }
};

const plugins = [serverSettingsPlugin, restorePlugin];
export default plugins;
