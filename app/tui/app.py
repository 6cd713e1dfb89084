"""The chat app: layout, key bindings, and the flow between store, widgets and the engine workers."""
import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.notifications import Notification, Notify
from textual.widgets import Footer, Header, ProgressBar

from app.reasoning import ReasoningEffortError, effort_vars, thinking_vars
from app.store import Chat, ChatStore, Sampling, StreamingReply
from app.tui import engine_work
from app.tui.chat_list import ChatList
from app.tui.commands import ChatCommands
from app.tui.conversation import Conversation
from app.tui.dialogs import ConfirmDialog, TextDialog
from app.tui.events import EngineNotice, ModelFailed, ModelLoaded, ModelProgress, ReplyFailed, ReplyFinished
from app.tui.frame_budget import FRAME_SECONDS, FrameBudget
from app.tui.help_screen import HelpScreen
from app.tui.message_view import MessageView
from app.tui.model_picker import ModelPicker, known_models, model_label
from app.tui.piece_buffer import PieceBuffer
from app.tui.prompt_input import PromptInput
from app.tui.settings_screen import SettingsScreen
from app.tui.status_bar import StatusBar, placement_text, prompt_text
from app.warm_up import NOTICE

NEW_TITLE = "New chat"


class ChatApp(App):
    CSS_PATH = "chat.tcss"
    TITLE = "gguf-chat"
    COMMANDS = App.COMMANDS | {ChatCommands}
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "regenerate", "Regenerate"),
        Binding("ctrl+g", "edit_last", "Edit last"),
        Binding("f3", "copy_reply", "Copy reply", show=False),
        Binding("ctrl+o", "pick_model", "Model"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("f2", "rename_chat", "Rename", show=False),
        Binding("f8", "delete_chat", "Delete", show=False),
        Binding("ctrl+f", "search", "Search", show=False),
        Binding("ctrl+b", "toggle_sidebar", "Sidebar", show=False),
        Binding("f1", "help", "Help"),
    ]

    def __init__(self, store: ChatStore, model: str, sampling: Sampling | None = None,
                 system_prompt: str = "", ctx: int | None = None, drop_old_turns: bool = False,
                 load_options: dict | None = None, reasoning_effort: str | None = None, reasoning: str | None = None,
                 warm_up: bool = True):
        """model (a path, owner/repo[:QUANT] or a pulled name), sampling and system_prompt: of new chats.
        load_options: more arguments of inference.load for every model (device, gpu_layers, vram_budget).
        reasoning_effort: low, medium or high, for every model whose template takes one (gpt-oss's); reasoning: "on"
        or "off", for every model whose template has the switch (Gemma 4's, Qwen3's; None: on). warm_up: each model
        loaded is warmed up before its first reply (--no-warmup: not)."""
        super().__init__()
        self.store = store
        self.new_chat_model = model
        self.new_chat_sampling = sampling or Sampling()
        self.new_chat_system_prompt = system_prompt
        self.ctx = ctx
        self.load_options = load_options or {}
        self.warm_up = warm_up
        self.drop_old_turns = drop_old_turns  # a chat that outgrows the context loses its oldest turns
        self.reasoning_effort, self.reasoning = reasoning_effort, reasoning
        self.template_vars = {}        # what the loaded model's template is given (thinking, reasoning effort)
        self.chat: Chat | None = None
        self.engine = None
        self.engine_model = ""         # the model self.engine runs
        self.loading_model = ""        # the model being loaded, '' when none
        self.reply: StreamingReply | None = None  # the reply being written, saved as it grows
        self.reply_view: MessageView | None = None
        self.reply_waits_for_model = False
        self.stop_event = threading.Event()
        self.pieces = PieceBuffer()     # the reply's text from the engine thread, not shown yet
        self.frame_timer = None         # shows self.pieces once a frame while the engine writes
        self.frame_budget = FrameBudget()  # skips frames while the UI thread is over its share of a core
        self.shown_chars = 0            # of the reply's text, how much its view shows
        # Every load, warm-up and reply runs on this one thread: numba's parallel regions run on a pool of the
        # calling thread's (libgomp), and textual's thread workers take any thread of asyncio's executor, which
        # keeps them; a reply sent during the load ran on a second thread, whose pool next to the load's made
        # libgomp stop spinning: replies at 0.3-0.66 of run's speed on 2 cores (issue 38)
        self.engine_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")
        self.preparing_since = 0.0     # when the kernels' first compile began (monotonic), 0 when it is not running
        self.preparing_timer = None    # counts its seconds in the status bar
        self.preparing_note = None     # its lasting notification, taken down when the kernels are ready

    def compose(self) -> ComposeResult:
        yield Header()
        with Horizontal():
            yield ChatList(id="sidebar")
            with Vertical(id="main"):
                yield Conversation(id="conversation")
                yield ProgressBar(total=None, show_eta=False, id="loading")
                yield PromptInput(id="prompt")
        yield StatusBar(id="status")
        yield Footer()

    async def on_mount(self) -> None:
        chats = self.store.list_chats()
        await self.open_chat(chats[0] if chats else self.create_chat())
        self.query_one(PromptInput).focus()

    def on_unmount(self) -> None:
        self.stop_event.set()  # a reply being written stops at its next token, and its thread ends
        self.engine_thread.shutdown(wait=False, cancel_futures=True)

    # chats

    def create_chat(self) -> Chat:
        return self.store.create_chat(NEW_TITLE, self.new_chat_model, self.new_chat_system_prompt,
                                      replace(self.new_chat_sampling))

    async def open_chat(self, chat: Chat) -> None:
        if self.reply_waits_for_model:
            await self.end_reply("stopped", None)
        elif self.reply_view is not None:  # the reply is stopped and ends in the store; its view goes away
            self.stop_event.set()
            await self.reply_view.finish(self.reply_view.message)
            self.reply_view = None
        self.chat = chat
        self.sub_title = chat.title
        messages = self.store.messages(chat.id)
        await self.query_one(Conversation).show(messages, model_label(self.model_of(chat)))
        measured = [m.stats for m in messages if m.stats]  # the status bar shows the chat's last reply
        status = self.query_one(StatusBar)
        status.tok_s = measured[-1]["generation_tok_s"] if measured else 0.0
        status.prompt = prompt_text(measured[-1] if measured else None)
        status.ctx_used = measured[-1]["context_tokens"] if measured else 0
        await self.refresh_sidebar()
        self.ensure_model()

    async def refresh_sidebar(self) -> None:
        query = self.query_one("#search").value
        await self.query_one(ChatList).show(self.store.list_chats(query), self.chat.id if self.chat else None)

    def model_of(self, chat: Chat) -> str:
        return chat.model or self.new_chat_model

    @on(ChatList.Selected)
    async def chat_selected(self, event: ChatList.Selected) -> None:
        if self.chat is None or event.chat_id != self.chat.id:
            await self.open_chat(self.store.get_chat(event.chat_id))
        self.query_one(PromptInput).focus()

    @on(ChatList.SearchChanged)
    async def search_changed(self) -> None:
        await self.refresh_sidebar()

    # the model

    def ensure_model(self) -> None:
        """Load the open chat's model unless it is loaded or loading."""
        model = self.model_of(self.chat)
        if model in (self.engine_model, self.loading_model):
            self.show_model_status()
            return
        if self.reply is not None and not self.reply_waits_for_model:
            return  # the engine is writing a reply: load once it ends
        self.loading_model = model
        self.engine = None
        self.engine_model = ""
        self.query_one("#loading", ProgressBar).update(total=None, progress=0)
        self.query_one("#loading").display = True
        self.show_model_status()
        self.load_model(model)

    @work(exclusive=True, group="load")
    async def load_model(self, model: str) -> None:
        await asyncio.get_running_loop().run_in_executor(self.engine_thread, engine_work.load_model, model, self.ctx,
                                                         self.post_message, self.load_options, self.warm_up)

    @on(ModelProgress)
    def model_progress(self, event: ModelProgress) -> None:
        if event.model == self.loading_model:
            self.query_one("#loading", ProgressBar).update(total=event.total, progress=event.done)
            self.query_one(StatusBar).state = f"pulling {event.file}…"

    @on(ModelLoaded)
    async def model_loaded(self, event: ModelLoaded) -> None:
        # textual's message loop holds the last message it handled until the next one comes: the engine referenced
        # there would outlive its replacement's load, whose gc.freeze() would then keep it (engine_work)
        engine, event.engine = event.engine, None
        if event.model != self.loading_model:
            return  # another model was asked for meanwhile
        self.engine, self.engine_model, self.loading_model = engine, event.model, ""
        self.template_vars = self.reasoning_vars()
        self.query_one("#loading").display = False
        self.end_preparing()
        self.notify(f"{model_label(event.model)} loaded in {event.seconds:.1f} s", timeout=3)
        placement = self.engine.placement
        if 0 < placement.n_gpu_layers < len(placement.layers):  # a split is slower: say why it was made
            share = self.engine.gpu_share
            self.notify(placement.summary().splitlines()[0] + (f"; {share.describe()}" if share else ""),
                        title="Placement", timeout=8)
        self.show_model_status()
        if self.reply_waits_for_model:
            self.start_generation()

    def reasoning_vars(self) -> dict:
        """Thinking and the reasoning effort asked for, as the loaded model's template takes them; what it cannot
        take goes without (said once a load)."""
        out = {}
        for vars_of, asked in ((thinking_vars, self.reasoning), (effort_vars, self.reasoning_effort)):
            try:
                out |= vars_of(self.engine.chat_template, asked)
            except ReasoningEffortError as e:
                self.notify(f"{e}: its replies go without it", title="Model", severity="warning", timeout=10)
        return out

    @on(EngineNotice)
    def engine_notice(self, event: EngineNotice) -> None:
        if event.text == NOTICE and self.loading_model:
            # the first start's compile: said until every kernel a reply needs is ready (a message sent meanwhile
            # waits for it, to stream at full speed), its seconds counted in the status bar; said once, however
            # often it comes (a second notice would outlive end_preparing, which takes down the one it knows)
            if self.preparing_timer is not None:
                return
            self.preparing_since = time.monotonic()
            self.preparing_timer = self.set_interval(1.0, self.show_model_status)
            self.preparing_note = Notification(event.text, "Engine", "warning", timeout=3600)
            self.post_message(Notify(self.preparing_note))
        else:
            self.notify(event.text, title="Engine", severity="warning", timeout=10)
        self.show_model_status()

    def end_preparing(self) -> None:
        if self.preparing_timer is not None:
            self.preparing_timer.stop()
            self.preparing_timer, self.preparing_since = None, 0.0
            # that notice alone: clear_notifications() also took down whatever was said meanwhile (a settings
            # error shown as the load ended: test_settings_out_of_range_are_refused failed in a clean clone's CI)
            self._unnotify(self.preparing_note)

    @on(ModelFailed)
    async def model_failed(self, event: ModelFailed) -> None:
        if event.model != self.loading_model:
            return
        self.loading_model = ""
        self.query_one("#loading").display = False
        self.end_preparing()
        self.notify(f"Could not load {event.model}: {event.error}", title="Model", severity="error", timeout=15)
        self.show_model_status(error="not loaded: Ctrl+O picks another model")
        if self.reply_waits_for_model:
            await self.end_reply("error", None)

    def show_model_status(self, error: str = "") -> None:
        status = self.query_one(StatusBar)
        status.model = model_label(self.model_of(self.chat))
        if self.loading_model and self.preparing_since:
            seconds = time.monotonic() - self.preparing_since
            waits = ", your message waits for them" if self.reply_waits_for_model else ""
            status.state = f"preparing the kernels (first start): {seconds:.0f} s{waits}…"
        elif self.loading_model:
            status.state = "loading…"
        elif self.reply is not None:
            status.state = "generating…"
        else:
            status.state = error
        status.placement = placement_text(self.engine) if self.engine else ""
        status.n_ctx = self.engine.n_ctx if self.engine else 0

    # replies

    @on(PromptInput.Submitted)
    async def send(self, event: PromptInput.Submitted) -> None:
        if self.reply is not None:
            self.notify("A reply is being written: Esc stops it", severity="warning")
            return
        prompt = self.query_one(PromptInput)
        prompt.clear()
        prompt.last_sent = event.text
        message = self.store.add_message(self.chat.id, "user", event.text)
        if self.chat.title == NEW_TITLE:
            self.chat.title = event.text.splitlines()[0][:40]
            self.store.update_chat(self.chat)
            self.sub_title = self.chat.title
        await self.refresh_sidebar()
        await self.query_one(Conversation).add(message)
        await self.start_reply()

    async def start_reply(self) -> None:
        self.reply = StreamingReply(self.store, self.chat.id)
        self.reply_view = await self.query_one(Conversation).add(self.reply.message)
        self.stop_event = threading.Event()
        self.show_model_status()
        if self.engine is not None and self.engine_model == self.model_of(self.chat):
            self.start_generation()
        else:
            self.reply_waits_for_model = True
            self.ensure_model()

    def start_generation(self) -> None:
        self.reply_waits_for_model = False
        messages = [m for m in self.store.messages(self.chat.id) if m.id != self.reply.message.id]
        self.pieces, self.frame_budget, self.shown_chars = PieceBuffer(), FrameBudget(), 0
        self.frame_timer = self.set_interval(FRAME_SECONDS, self.show_frame)
        template = self.engine.chat_template
        self.reply_view.reply_format = template.reply_format if template else "think"
        self.generate(self.engine, engine_work.chat_history(self.chat, messages), self.chat.sampling,
                      self.stop_event, self.pieces)

    @work(exclusive=True, group="generate")
    async def generate(self, engine, history, sampling, stop, pieces) -> None:
        await asyncio.get_running_loop().run_in_executor(self.engine_thread, engine_work.generate_reply, engine,
                                                         history, sampling, stop, pieces, self.post_message,
                                                         self.drop_old_turns, self.template_vars)

    async def show_frame(self, final: bool = False) -> None:
        """Each tick: what the engine wrote since the last one onto the stored reply (saved every
        StreamingReply.interval, drawn or not), and onto the screen when the frame budget allows (always when
        `final`)."""
        text = self.pieces.take()
        if self.reply is None:
            return
        if text:
            self.reply.append(text)
        if self.reply_view is None or len(self.reply.text) == self.shown_chars:
            return
        if final or self.frame_budget.allows():
            unshown = self.reply.text[self.shown_chars:]
            self.shown_chars = len(self.reply.text)
            await self.reply_view.append(unshown)

    @on(ReplyFinished)
    async def reply_finished(self, event: ReplyFinished) -> None:
        await self.end_reply("stopped" if event.stopped else "done", event.stats)
        if event.stats:
            status = self.query_one(StatusBar)
            status.tok_s = event.stats["generation_tok_s"]
            status.prompt = prompt_text(event.stats)
            status.ctx_used = min(event.stats["context_tokens"], status.n_ctx)
            if event.stats["finish_reason"] == "context full":
                self.notify("The context is full: start a new chat (Ctrl+N), raise --ctx or use --drop-old-turns",
                            severity="warning", timeout=10)

    @on(ReplyFailed)
    async def reply_failed(self, event: ReplyFailed) -> None:
        self.notify(event.error, title="Reply failed", severity="error", timeout=15)
        await self.end_reply("error", None)

    async def end_reply(self, state: str, stats: dict | None) -> None:
        if self.frame_timer is not None:
            self.frame_timer.stop()
            self.frame_timer = None
            await self.show_frame(final=True)  # what came after the last frame
        message = self.reply.finish(state, stats)
        if self.reply_view is not None:
            await self.reply_view.finish(message)
        self.reply, self.reply_view, self.reply_waits_for_model = None, None, False
        self.ensure_model()  # the chat open now may use another model
        self.show_model_status()

    # actions

    async def action_stop(self) -> None:
        if self.reply is None:
            self.query_one(PromptInput).focus()
        elif self.reply_waits_for_model:
            await self.end_reply("stopped", None)
        else:
            self.stop_event.set()

    def refuse_while_replying(self) -> bool:
        if self.reply is not None:
            self.notify("A reply is being written: Esc stops it", severity="warning")
        return self.reply is not None

    async def action_new_chat(self) -> None:
        if self.store.messages(self.chat.id):
            await self.open_chat(self.create_chat())
        self.query_one(PromptInput).focus()

    async def action_regenerate(self) -> None:
        if self.refuse_while_replying():
            return
        messages = self.store.messages(self.chat.id)
        if messages and messages[-1].role == "assistant":
            self.store.delete_messages_from(self.chat.id, messages[-1].id)
            await self.query_one(Conversation).remove_from(messages[-1].id)
            messages.pop()
        if not messages:
            self.notify("Nothing to regenerate yet", severity="warning")
            return
        await self.start_reply()

    async def action_edit_last(self) -> None:
        if self.refuse_while_replying():
            return
        users = [m for m in self.store.messages(self.chat.id) if m.role == "user"]
        if not users:
            self.notify("No message to edit yet", severity="warning")
            return
        self.store.delete_messages_from(self.chat.id, users[-1].id)
        await self.query_one(Conversation).remove_from(users[-1].id)
        prompt = self.query_one(PromptInput)
        prompt.load_text(users[-1].content)
        prompt.move_cursor(prompt.document.end)
        prompt.focus()

    def action_copy_reply(self) -> None:
        view = self.query_one(Conversation).last_reply()
        if view is None:
            self.notify("No reply to copy yet", severity="warning")
        else:
            view.action_copy()

    def action_copy_code(self) -> None:
        view = self.query_one(Conversation).last_reply()
        if view is None:
            self.notify("No reply to copy from yet", severity="warning")
        else:
            view.action_copy_code()

    @work
    async def action_rename_chat(self) -> None:
        title = await self.push_screen_wait(TextDialog("Rename chat", self.chat.title))
        if title:
            self.chat.title = title
            self.store.update_chat(self.chat)
            self.sub_title = title
            await self.refresh_sidebar()

    @work
    async def action_delete_chat(self) -> None:
        if self.refuse_while_replying():
            return
        if not await self.push_screen_wait(ConfirmDialog(f"Delete “{self.chat.title}” and its messages?")):
            return
        self.store.delete_chat(self.chat.id)
        chats = self.store.list_chats()
        await self.open_chat(chats[0] if chats else self.create_chat())

    @work
    async def action_settings(self) -> None:
        chat = await self.push_screen_wait(SettingsScreen(self.chat))
        if chat is not None:
            self.chat = chat
            self.store.update_chat(chat)

    @work
    async def action_pick_model(self) -> None:
        if self.refuse_while_replying():
            return
        models = known_models(self.store, self.new_chat_model)
        model = await self.push_screen_wait(ModelPicker(models, self.model_of(self.chat)))
        if model:
            self.chat.model = model
            self.store.update_chat(self.chat)
            self.query_one(Conversation).model_name = model_label(model)
            self.ensure_model()

    def action_search(self) -> None:
        self.query_one("#sidebar").display = True
        self.query_one("#search").focus()

    def action_toggle_sidebar(self) -> None:
        sidebar = self.query_one("#sidebar")
        sidebar.display = not sidebar.display

    def action_help(self) -> None:
        self.push_screen(HelpScreen(self.BINDINGS))
