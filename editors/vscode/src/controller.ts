// The extension's moving parts: one language client at a time, the status bar item,
// the commands and the settings bridge. The client is built by an injected factory so
// unit tests run this against a mocked `vscode` module and a fake client.
import * as vscode from 'vscode';
import {
  DocumentFilter,
  LaunchConfig,
  ServerSettings,
  documentSelector,
  languages,
  launchConfig,
  needsRestart,
  serverSettings,
} from './settings';
import { KogStats, KogStatus, formatStats, formatStatus } from './status';

/** The slice of vscode-languageclient's LanguageClient the extension uses. */
export interface ClientLike {
  start(): Promise<void>;
  stop(): Promise<void>;
  onNotification(method: string, handler: (params: any) => void): vscode.Disposable;
  sendRequest<R>(method: string, param?: unknown): Promise<R>;
  sendNotification(method: string, params?: unknown): Promise<void>;
}

export interface ClientHooks {
  /** Asked before each automatic inline completion request; false skips it client-side. */
  automaticAllowed(): boolean;
}

export type ClientFactory = (
  launch: LaunchConfig,
  init: ServerSettings,
  output: vscode.LogOutputChannel,
  hooks: ClientHooks,
  selector: DocumentFilter[],
) => ClientLike;

export const COMMANDS = {
  trigger: 'kog.triggerSuggestion',
  toggle: 'kog.toggleAutoSuggestions',
  restart: 'kog.restartServer',
  stats: 'kog.showStats',
};

export class KogController implements vscode.Disposable {
  private client: ClientLike | undefined;
  private clientSubs: vscode.Disposable[] = [];
  /** Set while no document of a served language is open: starts the server on the first one. */
  private waiting: vscode.Disposable | undefined;
  private readonly subs: vscode.Disposable[] = [];
  private readonly item: vscode.StatusBarItem;
  private readonly output: vscode.LogOutputChannel;
  private status: KogStatus = { state: 'stopped' };

  constructor(private readonly factory: ClientFactory) {
    this.output = vscode.window.createOutputChannel('kog', { log: true });
    this.item = vscode.window.createStatusBarItem(vscode.StatusBarAlignment.Right, 100);
    this.item.command = COMMANDS.stats;
    this.item.show();
    this.render();
    this.subs.push(
      this.output,
      this.item,
      vscode.commands.registerCommand(COMMANDS.trigger, () =>
        vscode.commands.executeCommand('editor.action.inlineSuggest.trigger'),
      ),
      vscode.commands.registerCommand(COMMANDS.toggle, () => this.toggleAutomatic()),
      vscode.commands.registerCommand(COMMANDS.restart, () => this.restart()),
      vscode.commands.registerCommand(COMMANDS.stats, () => this.showStats()),
      vscode.workspace.onDidChangeConfiguration((e) => this.onConfigChanged(e)),
    );
  }

  private config(): vscode.WorkspaceConfiguration {
    return vscode.workspace.getConfiguration('kog');
  }

  get automaticEnabled(): boolean {
    return this.config().get<boolean>('enable', true) !== false;
  }

  get currentStatus(): KogStatus {
    return this.status;
  }

  private setStatus(s: KogStatus): void {
    this.status = s;
    this.render();
  }

  private render(): void {
    const view = formatStatus(this.status, this.automaticEnabled);
    this.item.text = view.text;
    this.item.tooltip = view.tooltip;
    this.item.backgroundColor = view.error ? new vscode.ThemeColor('statusBarItem.errorBackground') : undefined;
  }

  /**
   * Starts the server now if a document of a served language (`kog.languages`) is open, else on the first one that
   * opens: the extension activates at startup in every window, and a window without such documents never loads a
   * model.
   */
  async startWhenNeeded(): Promise<void> {
    this.stopWaiting();
    const langs = languages(this.config());
    const selector = documentSelector(langs);
    const served = (d: vscode.TextDocument) => vscode.languages.match(selector, d) > 0;
    if (vscode.workspace.textDocuments.some(served)) {
      await this.start();
      return;
    }
    this.setStatus({
      state: 'idle',
      message: `starts with the first ${langs.includes('*') ? '' : langs.join(' / ') + ' '}document (kog.languages)`,
    });
    const sub = vscode.workspace.onDidOpenTextDocument((d) => {
      if (this.waiting !== sub || !served(d)) return;
      return this.start();   // which stops this wait
    });
    this.waiting = sub;
  }

  /** Drops the wait for a first document of a served language, if there is one. */
  private stopWaiting(): void {
    this.waiting?.dispose();
    this.waiting = undefined;
  }

  async start(): Promise<void> {
    this.stopWaiting();
    const cfg = this.config();
    const launch = launchConfig(cfg);
    const selector = documentSelector(languages(cfg));
    this.output.appendLine(`starting: ${launch.command} ${launch.args.join(' ')}`);
    this.setStatus({ state: 'starting', message: 'starting kog-lsp' });
    const client = this.factory(launch, serverSettings(cfg), this.output, {
      automaticAllowed: () => this.automaticEnabled,
    }, selector);
    this.client = client;
    this.clientSubs.push(
      client.onNotification('kog/status', (p: KogStatus) => {
        if (this.client === client) this.setStatus({ ...p });
      }),
    );
    try {
      await client.start();
      // The server reports loading/ready itself; until it does, say the process is up.
      if (this.status.state === 'starting') this.setStatus({ state: 'loading', message: 'server started' });
    } catch (err) {
      const msg = err instanceof Error ? err.message : String(err);
      this.output.appendLine(`start failed: ${msg}`);
      this.setStatus({ state: 'error', message: `kog-lsp did not start: ${msg}` });
      void vscode.window.showErrorMessage(
        `kog-lsp did not start (${msg}). Check kog.pythonPath / kog.serverPath.`,
      );
    }
  }

  async stop(): Promise<void> {
    const client = this.client;
    this.client = undefined;
    this.clientSubs.forEach((d) => d.dispose());
    this.clientSubs = [];
    if (client) {
      try {
        await client.stop();
      } catch (err) {
        this.output.appendLine(`stop: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
    this.setStatus({ state: 'stopped' });
  }

  async restart(): Promise<void> {
    await this.stop();
    await this.start();
  }

  async toggleAutomatic(): Promise<void> {
    const next = !this.automaticEnabled;
    // The configuration listener forwards the new value to the server.
    await this.config().update('enable', next, vscode.ConfigurationTarget.Global);
    this.render();
    void vscode.window.showInformationMessage(`kog: automatic suggestions ${next ? 'on' : 'off'}`);
  }

  async showStats(): Promise<void> {
    if (!this.client) {
      void vscode.window.showWarningMessage('kog-lsp is not running');
      return;
    }
    try {
      const stats = await this.client.sendRequest<KogStats>('kog/stats', {});
      const doc = await vscode.workspace.openTextDocument({ language: 'markdown', content: formatStats(stats) });
      await vscode.window.showTextDocument(doc, { preview: true });
    } catch (err) {
      void vscode.window.showErrorMessage(`kog/stats failed: ${err instanceof Error ? err.message : String(err)}`);
    }
  }

  private async onConfigChanged(e: vscode.ConfigurationChangeEvent): Promise<void> {
    if (!e.affectsConfiguration('kog')) return;
    if (needsRestart((s) => e.affectsConfiguration(s))) {
      this.output.appendLine('launch settings changed: restarting kog-lsp');
      await this.stop();
      await this.startWhenNeeded();
      return;
    }
    this.render();
    if (this.client) {
      await this.client.sendNotification('workspace/didChangeConfiguration', {
        settings: { kog: serverSettings(this.config()) },
      });
    }
  }

  async dispose(): Promise<void> {
    this.stopWaiting();
    await this.stop();
    this.subs.forEach((d) => d.dispose());
  }
}
